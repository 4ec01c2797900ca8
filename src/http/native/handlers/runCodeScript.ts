import type { RunScriptInput } from '../../../../core/code-interpreter/types.js';
import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { jsonBody, untilClientGone } from '../guest-io.js';

/** A one-shot program; a client that hangs up kills it (the abort reaches the guest agent). */
export const runCodeScript: NativeHandler = async (ctx) => {
  const { language, code, argv, envs, cwd, user, timeoutMs } = jsonBody<RunScriptInput>(ctx);
  const result = await ctx.services.codeInterpreter.runScript(principalOf(ctx), sandboxIdOf(ctx), { language, code, argv, envs, cwd, user, timeoutMs }, untilClientGone(ctx));
  ctx.res.status(200).json({ exitCode: result.exitCode, output: result.output, charts: result.charts, timedOut: result.timedOut });
};

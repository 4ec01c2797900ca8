import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import type { ExecInput } from '../../../../core/host-client.js';

export const runCommand: NativeHandler = async (ctx) => {
  const body = ctx.api.request.requestBody as ExecInput;
  // A client that hangs up cancels the command: the abort travels to the guest agent, which
  // kills the process group, so nothing keeps running for nobody.
  const abort = new AbortController();
  ctx.res.on('close', () => {
    if (!ctx.res.writableFinished) abort.abort();
  });
  const result = await ctx.services.sandboxes.exec(principalOf(ctx), sandboxIdOf(ctx), body, abort.signal);
  ctx.res.status(200).json(result);
};

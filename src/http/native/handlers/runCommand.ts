import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { untilClientGone } from '../guest-io.js';
import { NestboxError } from '../../../../core/errors.js';

interface RunCommandBody {
  cmd?: string;
  argv?: string[];
  cwd?: string;
  env?: Record<string, string>;
  timeoutMs?: number;
  detach?: boolean;
  user?: string;
  tag?: string;
  stdin?: boolean;
  pty?: { cols: number; rows: number };
}

const DETACHED_ONLY = ['tag', 'stdin', 'pty'] as const;

export const runCommand: NativeHandler = async (ctx) => {
  const { detach, ...body } = ctx.api.request.requestBody as RunCommandBody;
  if ((body.cmd === undefined) === (body.argv === undefined)) {
    throw new NestboxError('validation_failed', 'cmd: give exactly one of cmd (run by bash -lc) and argv', { field: 'cmd' });
  }
  if (detach) {
    // Answers as soon as the process runs; follow it under /commands/{processId}.
    return void ctx.res.status(202).json(await ctx.services.toolbox.startProcess(principalOf(ctx), sandboxIdOf(ctx), body, untilClientGone(ctx)));
  }
  const detachedOnly = DETACHED_ONLY.find((field) => body[field] !== undefined);
  if (detachedOnly) throw new NestboxError('validation_failed', `${detachedOnly}: only for detached commands ("detach": true)`, { field: detachedOnly });
  // A client that hangs up cancels the command: the abort travels to the guest agent, which
  // kills the process group, so nothing keeps running for nobody.
  const abort = new AbortController();
  ctx.res.on('close', () => {
    if (!ctx.res.writableFinished) abort.abort();
  });
  const { cmd, argv, cwd, env, timeoutMs, user } = body;
  const result = await ctx.services.toolbox.exec(principalOf(ctx), sandboxIdOf(ctx), { cmd, argv, cwd, env, timeoutMs, user }, { signal: abort.signal });
  ctx.res.status(200).json(result);
};

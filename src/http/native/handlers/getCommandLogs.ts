import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';
import { param, queryNumber, untilClientGone } from '../guest-io.js';
import type { OutputInput } from '../../../../core/guest.js';

export const getCommandLogs: NativeHandler = async (ctx) => {
  const input: OutputInput = {
    offset: queryNumber(ctx, 'offset'),
    stdoutOffset: queryNumber(ctx, 'stdoutOffset'),
    stderrOffset: queryNumber(ctx, 'stderrOffset'),
    encoding: queryString(ctx, 'encoding') as OutputInput['encoding'],
    maxBytes: queryNumber(ctx, 'maxBytes'),
  };
  ctx.res.status(200).json(await ctx.services.toolbox.processOutput(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'processId'), input, untilClientGone(ctx)));
};

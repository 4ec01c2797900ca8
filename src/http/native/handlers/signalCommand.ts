import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { jsonBody, param, untilClientGone } from '../guest-io.js';
import type { ProcessSignal } from '../../../../core/guest.js';

export const signalCommand: NativeHandler = async (ctx) => {
  await ctx.services.toolbox.signalProcess(principalOf(ctx), sandboxIdOf(ctx), param(ctx, 'processId'), jsonBody<{ signal: ProcessSignal }>(ctx).signal, untilClientGone(ctx));
  ctx.res.status(204).end();
};

import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { queryBoolean, untilClientGone } from '../guest-io.js';

export const listCommands: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(await ctx.services.toolbox.listProcesses(principalOf(ctx), sandboxIdOf(ctx), { all: queryBoolean(ctx, 'all') }, untilClientGone(ctx)));
};

import type { NativeHandler } from '../context.js';
import { principalOf, queryList, queryString } from '../context.js';
import { renderSandbox } from '../render.js';
import type { SandboxState } from '../../../../core/state-machine.js';

export const listSandboxes: NativeHandler = async (ctx) => {
  const labels: Record<string, string> = {};
  for (const pair of queryList(ctx, 'label')) {
    const at = pair.indexOf('=');
    labels[pair.slice(0, at)] = pair.slice(at + 1);
  }
  const limit = queryString(ctx, 'limit');
  const page = await ctx.services.sandboxes.list(principalOf(ctx), {
    labels,
    states: queryList(ctx, 'state') as SandboxState[],
    limit: limit === undefined ? undefined : Number(limit),
    cursor: queryString(ctx, 'cursor'),
  });
  ctx.res.status(200).json({ items: page.items.map((s) => renderSandbox(s, principalOf(ctx))), nextCursor: page.nextCursor });
};

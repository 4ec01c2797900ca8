import type { NativeHandler } from '../context.js';
import { principalOf, queryList, queryString } from '../context.js';
import { queryNumber } from '../guest-io.js';
import { renderBuild } from '../render.js';
import type { BuildState } from '../../../../core/images/types.js';

export const listBuilds: NativeHandler = async (ctx) => {
  const items = await ctx.services.builds.list(principalOf(ctx), { name: queryString(ctx, 'name'), states: queryList(ctx, 'state') as BuildState[], limit: queryNumber(ctx, 'limit') });
  ctx.res.status(200).json({ items: items.map(renderBuild) });
};

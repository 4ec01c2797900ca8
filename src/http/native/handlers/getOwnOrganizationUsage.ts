import type { NativeHandler } from '../context.js';
import { principalOf, queryString } from '../context.js';
import { renderUsageRecords } from '../render-organizations.js';

export const getOwnOrganizationUsage: NativeHandler = async (ctx) => {
  const records = await ctx.services.organizations.ownUsage(principalOf(ctx), { from: queryString(ctx, 'from'), to: queryString(ctx, 'to') });
  ctx.res.status(200).json(renderUsageRecords(records));
};

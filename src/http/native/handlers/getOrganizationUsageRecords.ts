import type { NativeHandler } from '../context.js';
import { principalOf, queryString } from '../context.js';
import { renderUsageRecords } from '../render-organizations.js';

export const getOrganizationUsageRecords: NativeHandler = async (ctx) => {
  const records = await ctx.services.organizations.usage(principalOf(ctx), String(ctx.api.request.params.organizationId), { from: queryString(ctx, 'from'), to: queryString(ctx, 'to') });
  ctx.res.status(200).json(renderUsageRecords(records));
};

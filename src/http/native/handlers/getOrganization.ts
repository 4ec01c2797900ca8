import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderOrganization } from '../render-organizations.js';

export const getOrganization: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(renderOrganization(await ctx.services.organizations.get(principalOf(ctx), String(ctx.api.request.params.organizationId))));
};

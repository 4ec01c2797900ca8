import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderOrganization } from '../render-organizations.js';
import type { UpdateOrganizationInput } from '../../../../core/services/organizations.js';

export const updateOrganization: NativeHandler = async (ctx) => {
  const body = ctx.api.request.requestBody as UpdateOrganizationInput;
  ctx.res.status(200).json(renderOrganization(await ctx.services.organizations.update(principalOf(ctx), String(ctx.api.request.params.organizationId), body)));
};

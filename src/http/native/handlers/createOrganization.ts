import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderOrganization } from '../render-organizations.js';
import type { OrganizationLimitOverrides } from '../../../../core/types.js';

export const createOrganization: NativeHandler = async (ctx) => {
  const body = ctx.api.request.requestBody as { name: string; limits?: Partial<OrganizationLimitOverrides> };
  ctx.res.status(201).json(renderOrganization(await ctx.services.organizations.create(principalOf(ctx), body)));
};

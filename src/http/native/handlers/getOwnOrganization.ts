import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderOwnOrganization } from '../render-organizations.js';

export const getOwnOrganization: NativeHandler = async (ctx) => {
  ctx.res.status(200).json(renderOwnOrganization(await ctx.services.organizations.own(principalOf(ctx))));
};

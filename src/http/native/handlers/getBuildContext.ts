import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { param } from '../guest-io.js';
import { requireScope } from '../../../../core/services/auth.js';
import { contextObjectKey } from '../../../../core/object-store.js';
import { errors } from '../../../../core/errors.js';

export const getBuildContext: NativeHandler = async (ctx) => {
  const principal = principalOf(ctx);
  requireScope(principal, 'images:read');
  const sha256 = param(ctx, 'sha256');
  const stored = await ctx.services.objects.head(principal.organizationId, contextObjectKey(sha256));
  if (!stored) throw errors.notFound('build context', sha256);
  ctx.res.status(200).json({ sha256: stored.sha256, size: stored.size, createdAt: stored.createdAt.toISOString() });
};

import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { param, rawBody, untilClientGone } from '../guest-io.js';
import { requireScope } from '../../../../core/services/auth.js';
import { contextObjectKey } from '../../../../core/object-store.js';

/** A context tar, stored under its SHA-256 (checked while it streams in; nothing is kept on a mismatch). */
export const uploadBuildContext: NativeHandler = async (ctx) => {
  const principal = principalOf(ctx);
  requireScope(principal, 'images:write');
  const sha256 = param(ctx, 'sha256');
  const key = contextObjectKey(sha256);
  const existing = await ctx.services.objects.head(principal.organizationId, key);
  const stored = existing ?? (await ctx.services.objects.put(principal.organizationId, key, rawBody(ctx, ctx.services.config.builds.maxContextBytes), { expectSha256: sha256, maxBytes: ctx.services.config.builds.maxContextBytes, ...untilClientGone(ctx) }));
  if (existing) ctx.req.resume();
  ctx.res.status(201).json({ sha256: stored.sha256, size: stored.size, createdAt: stored.createdAt.toISOString() });
};

import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { jsonBody } from '../guest-io.js';
import { renderBuild } from '../render.js';
import { errors } from '../../../../core/errors.js';
import type { ImageBuild } from '../../../../core/images/types.js';

/** A pull is a build with only a FROM: the same status, logs, cancel and tags. */
export const pullImage: NativeHandler = async (ctx) => {
  const body = jsonBody<{ reference: string; name?: string; tags?: string[]; credentials?: { username: string; password: string } }>(ctx);
  const principal = principalOf(ctx);
  const { name, tag } = nameOfReference(body.reference);
  const { builds, idempotency } = ctx.services;
  const build = await idempotency.run<ImageBuild>(
    principal.organizationId,
    ctx.req.get('idempotency-key'),
    'pullImage',
    body,
    () =>
      builds.create(principal, {
        name: body.name ?? name,
        tags: body.tags ?? [tag],
        credentials: body.credentials,
        spec: { stages: [{ index: 0, from: { reference: body.reference }, at: { line: 1, text: `FROM ${body.reference}` }, steps: [] }], contexts: [], args: {}, ignore: [] },
      }),
    (b) => ({ buildId: b.id }),
    async (stored) => builds.get(principal, (stored as { buildId: string }).buildId),
  );
  ctx.res.status(202).json(renderBuild(build));
};

/** `ghcr.io/org/app:1.2` → name `app`, tag `1.2`; a digest reference → tag `latest`. */
function nameOfReference(reference: string): { name: string; tag: string } {
  if (/[\s\0]/.test(reference)) throw errors.validation('reference', 'must not contain spaces or NUL');
  const withoutDigest = reference.split('@')[0]!;
  const lastSlash = withoutDigest.lastIndexOf('/');
  const colon = withoutDigest.lastIndexOf(':');
  const tag = colon > lastSlash && !reference.includes('@') ? withoutDigest.slice(colon + 1) : 'latest';
  const repo = colon > lastSlash ? withoutDigest.slice(0, colon) : withoutDigest;
  const name = repo.slice(lastSlash + 1).replace(/[^A-Za-z0-9._-]/g, '-').replace(/^[^A-Za-z0-9]+/, '') || 'image';
  return { name, tag: /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/.test(tag) ? tag : 'latest' };
}

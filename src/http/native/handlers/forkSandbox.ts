import type { NativeHandler } from '../context.js';
import { principalOf, sandboxIdOf } from '../context.js';
import { renderSandbox } from '../render.js';
import type { ForkInput, ForkResult } from '../../../../core/services/sandboxes.js';

export const forkSandbox: NativeHandler = async (ctx) => {
  const body = (ctx.api.request.requestBody ?? {}) as ForkInput;
  const principal = principalOf(ctx);
  const id = sandboxIdOf(ctx);
  const { sandboxes, idempotency } = ctx.services;
  const result = await idempotency.run<ForkResult>(
    principal.organizationId,
    ctx.req.get('idempotency-key'),
    `forkSandbox:${id}`,
    body,
    () => sandboxes.fork(principal, id, body),
    (r) => ({ sandboxIds: r.sandboxes.map((s) => s.id), memoryCopied: r.memoryCopied, diskCopy: r.diskCopy }),
    async (stored) => {
      const s = stored as { sandboxIds: string[]; memoryCopied: boolean; diskCopy: string };
      return { sandboxes: await sandboxes.getMany(principal, s.sandboxIds), memoryCopied: s.memoryCopied, diskCopy: s.diskCopy };
    },
  );
  ctx.res.status(201).json({ sandboxes: result.sandboxes.map((s) => renderSandbox(s, principalOf(ctx))), memoryCopied: result.memoryCopied, diskCopy: result.diskCopy });
};

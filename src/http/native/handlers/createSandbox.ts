import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { renderSandbox } from '../render.js';
import type { CreateSandboxInput } from '../../../../core/services/sandboxes.js';
import type { Sandbox } from '../../../../core/types.js';

export const createSandbox: NativeHandler = async (ctx) => {
  const body = (ctx.api.request.requestBody ?? {}) as CreateSandboxInput;
  const principal = principalOf(ctx);
  const { sandboxes, idempotency } = ctx.services;
  const sandbox = await idempotency.run<Sandbox>(
    principal.organizationId,
    ctx.req.get('idempotency-key'),
    'createSandbox',
    body,
    () => sandboxes.create(principal, body),
    (s) => ({ sandboxIds: [s.id] }),
    async (stored) => (await sandboxes.getMany(principal, (stored as { sandboxIds: string[] }).sandboxIds))[0],
  );
  ctx.res.status(201).json(renderSandbox(sandbox, principalOf(ctx)));
};

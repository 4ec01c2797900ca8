import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';

export const evacuateHost: NativeHandler = async (ctx) => {
  const body = (ctx.api.request.requestBody ?? {}) as { hostId?: string };
  const result = await ctx.services.transfers.evacuate(principalOf(ctx), String(ctx.api.request.params.hostId), { hostId: body.hostId });
  ctx.res.status(200).json({
    moved: result.moved.map((m) => ({ sandboxId: m.sandbox.id, fromHostId: m.fromHostId, toHostId: m.toHostId, ms: m.ms })),
    failed: result.failed.map((f) => ({ sandboxId: f.sandboxId, error: { code: f.code, message: f.message } })),
    skipped: result.skipped,
  });
};

import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { param } from '../guest-io.js';
import { renderUsageSample } from '../usage.js';

export const getSandboxUsage: NativeHandler = async (ctx) => {
  const { sandbox, point } = await ctx.services.usage.latest(principalOf(ctx), param(ctx, 'sandboxId'));
  ctx.res.status(200).json({ sandboxId: sandbox.id, sample: point ? renderUsageSample(point) : null });
};

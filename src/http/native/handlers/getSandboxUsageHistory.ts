import type { NativeHandler } from '../context.js';
import { principalOf, queryString } from '../context.js';
import { param, queryNumber } from '../guest-io.js';
import { instantParam, renderUsageSample } from '../usage.js';

const DEFAULT_MAX_POINTS = 500;

export const getSandboxUsageHistory: NativeHandler = async (ctx) => {
  const start = instantParam(queryString(ctx, 'start'), 'start');
  const end = instantParam(queryString(ctx, 'end'), 'end');
  const range = await ctx.services.usage.range(principalOf(ctx), param(ctx, 'sandboxId'), { start, end, maxPoints: queryNumber(ctx, 'maxPoints') ?? DEFAULT_MAX_POINTS });
  ctx.res.status(200).json({ sandboxId: range.sandbox.id, start: range.start.toISOString(), end: range.end.toISOString(), samples: range.points.map(renderUsageSample) });
};

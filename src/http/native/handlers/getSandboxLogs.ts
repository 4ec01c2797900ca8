import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';
import { renderLogEntry } from '../render-events.js';

export const getSandboxLogs: NativeHandler = async (ctx) => {
  const since = queryString(ctx, 'since');
  const until = queryString(ctx, 'until');
  const level = queryString(ctx, 'level') as 'info' | 'warn' | 'error' | undefined;
  const entries = await ctx.services.events.sandboxLogs(principalOf(ctx), sandboxIdOf(ctx), {
    limit: Number(queryString(ctx, 'limit') ?? 100),
    direction: queryString(ctx, 'direction') === 'backward' ? 'backward' : 'forward',
    ...(since ? { since: new Date(since) } : {}),
    ...(until ? { until: new Date(until) } : {}),
    ...(level ? { minLevel: level } : {}),
  });
  ctx.res.status(200).json({ entries: entries.map(renderLogEntry) });
};

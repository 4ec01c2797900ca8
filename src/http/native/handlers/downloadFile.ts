import { pipeline } from 'node:stream/promises';
import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';

export const downloadFile: NativeHandler = async (ctx) => {
  const range = typeof ctx.req.headers.range === 'string' ? ctx.req.headers.range : undefined;
  const file = await ctx.services.sandboxes.readFile(principalOf(ctx), sandboxIdOf(ctx), queryString(ctx, 'path')!, range);
  ctx.res.status(file.status);
  for (const [name, value] of Object.entries(file.headers)) ctx.res.setHeader(name, value);
  ctx.res.setHeader('content-type', 'application/octet-stream');
  await pipeline(file.body, ctx.res);
};

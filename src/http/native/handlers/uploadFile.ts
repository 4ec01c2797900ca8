import type { NativeHandler } from '../context.js';
import { principalOf, queryString, sandboxIdOf } from '../context.js';
import { NestboxError } from '../../../../core/errors.js';
import { streamedBody } from '../../../../http-kit/request-body.js';

export const uploadFile: NativeHandler = async (ctx) => {
  const max = ctx.services.config.limits.maxUploadBytes;
  const declared = Number(ctx.req.headers['content-length'] ?? 0);
  if (declared > max) throw new NestboxError('payload_too_large', `body: ${declared} bytes exceeds the upload limit of ${max} bytes`);
  const contentType = ctx.req.headers['content-type'];
  if (contentType && contentType.startsWith('application/json')) {
    throw new NestboxError('unsupported_media_type', 'body: send the file as raw bytes (application/octet-stream), not JSON');
  }
  const info = await ctx.services.toolbox.writeFile(principalOf(ctx), sandboxIdOf(ctx), queryString(ctx, 'path')!, streamedBody(ctx.req, max), {
    mode: queryString(ctx, 'mode'),
  });
  ctx.res.status(200).json(info);
};

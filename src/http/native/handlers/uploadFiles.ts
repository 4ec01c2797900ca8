import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const uploadFiles: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: '/files/upload',
    operation: 'write files of',
    body: 'raw',
    maxBodyBytes: ctx.services.config.limits.maxUploadBytes,
  });

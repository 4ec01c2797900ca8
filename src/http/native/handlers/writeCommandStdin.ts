import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const writeCommandStdin: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: `/processes/${param(ctx, 'processId')}/stdin`,
    operation: 'write to processes of',
    body: 'raw',
    maxBodyBytes: ctx.services.config.limits.maxUploadBytes,
  });

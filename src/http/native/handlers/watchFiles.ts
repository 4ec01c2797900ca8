import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const watchFiles: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: '/files/watch',
    operation: 'watch files of',
    query: ['path', 'recursive'],
    stream: true,
  });

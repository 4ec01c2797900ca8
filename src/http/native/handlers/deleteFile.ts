import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const deleteFile: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'DELETE',
    path: '/files',
    operation: 'delete files of',
    query: ['path', 'recursive'],
  });

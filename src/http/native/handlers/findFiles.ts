import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const findFiles: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: '/files/find',
    operation: 'find files of',
    query: ['path', 'pattern', 'maxResults'],
  });

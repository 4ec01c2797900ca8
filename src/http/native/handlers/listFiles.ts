import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const listFiles: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: '/files/list',
    operation: 'list files of',
    fileRead: true,
    query: ['path', 'depth'],
  });

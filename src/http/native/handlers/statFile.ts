import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const statFile: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: '/files/stat',
    operation: 'read files of',
    fileRead: true,
    query: ['path'],
  });

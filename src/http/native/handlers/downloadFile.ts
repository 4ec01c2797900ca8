import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

/** Streams the file (one Range header honoured); works on stopped sandboxes too. */
export const downloadFile: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: '/files/content',
    operation: 'read files of',
    fileRead: true,
    query: ['path'],
  });

import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const downloadFiles: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: '/files/download',
    operation: 'read files of',
    body: 'json',
  });

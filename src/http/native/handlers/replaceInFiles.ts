import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const replaceInFiles: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: '/files/replace',
    operation: 'change files of',
    body: 'json',
  });

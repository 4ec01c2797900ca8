import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const makeDirectory: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: '/files/mkdir',
    operation: 'create directories in',
    body: 'json',
  });

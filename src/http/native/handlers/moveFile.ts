import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const moveFile: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: '/files/move',
    operation: 'move files of',
    body: 'json',
  });

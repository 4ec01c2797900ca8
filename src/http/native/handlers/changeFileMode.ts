import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const changeFileMode: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: '/files/chmod',
    operation: 'change files of',
    body: 'json',
  });

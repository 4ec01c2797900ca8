import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const changeFileOwner: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: '/files/chown',
    operation: 'change files of',
    body: 'json',
  });

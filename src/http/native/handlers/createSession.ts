import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const createSession: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: '/sessions',
    operation: 'start sessions in',
    body: 'json',
  });

import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const listSessions: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: '/sessions',
    operation: 'list sessions of',
  });

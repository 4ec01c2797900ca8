import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const deleteSession: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'DELETE',
    path: `/sessions/${param(ctx, 'sessionId')}`,
    operation: 'end sessions of',
  });

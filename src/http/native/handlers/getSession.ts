import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const getSession: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: `/sessions/${param(ctx, 'sessionId')}`,
    operation: 'inspect sessions of',
  });

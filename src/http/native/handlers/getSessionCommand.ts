import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const getSessionCommand: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: `/sessions/${param(ctx, 'sessionId')}/commands/${param(ctx, 'commandId')}`,
    operation: 'inspect session commands of',
  });

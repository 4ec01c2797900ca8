import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const killCommand: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'DELETE',
    path: `/processes/${param(ctx, 'processId')}`,
    operation: 'kill processes of',
  });

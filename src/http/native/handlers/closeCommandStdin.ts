import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const closeCommandStdin: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: `/processes/${param(ctx, 'processId')}/stdin/close`,
    operation: 'close stdin of processes of',
  });

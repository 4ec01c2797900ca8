import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const resizeCommandTerminal: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: `/processes/${param(ctx, 'processId')}/resize`,
    operation: 'resize terminals of',
    body: 'json',
  });

import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const streamCommand: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: `/processes/${param(ctx, 'processId')}/events`,
    operation: 'stream process output of',
    query: ['stdoutOffset', 'stderrOffset'],
    stream: true,
  });

import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const runSessionCommand: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: `/sessions/${param(ctx, 'sessionId')}/commands`,
    operation: 'run commands in',
    body: 'json',
  });

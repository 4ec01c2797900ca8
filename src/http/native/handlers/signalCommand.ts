import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const signalCommand: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: `/processes/${param(ctx, 'processId')}/signal`,
    operation: 'signal processes of',
    body: 'json',
  });

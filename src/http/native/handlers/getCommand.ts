import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const getCommand: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: `/processes/${param(ctx, 'processId')}`,
    operation: 'inspect processes of',
  });

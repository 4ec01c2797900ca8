import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const getCommandLogs: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: `/processes/${param(ctx, 'processId')}/output`,
    operation: 'read process output of',
    query: ['offset', 'stdoutOffset', 'stderrOffset', 'encoding', 'maxBytes'],
  });

import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const listCommands: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: '/processes',
    operation: 'list processes of',
    query: ['all'],
  });

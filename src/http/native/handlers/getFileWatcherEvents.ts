import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const getFileWatcherEvents: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: `/files/watchers/${param(ctx, 'watcherId')}/events`,
    operation: 'watch files of',
  });

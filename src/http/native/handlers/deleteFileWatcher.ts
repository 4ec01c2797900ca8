import type { NativeHandler } from '../context.js';
import { forwardToAgent, param } from '../agent-forward.js';

export const deleteFileWatcher: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'DELETE',
    path: `/files/watchers/${param(ctx, 'watcherId')}`,
    operation: 'watch files of',
  });

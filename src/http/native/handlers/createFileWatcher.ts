import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const createFileWatcher: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'POST',
    path: '/files/watchers',
    operation: 'watch files of',
    body: 'json',
  });

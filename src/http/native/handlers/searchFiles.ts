import type { NativeHandler } from '../context.js';
import { forwardToAgent } from '../agent-forward.js';

export const searchFiles: NativeHandler = (ctx) =>
  forwardToAgent(ctx, {
    method: 'GET',
    path: '/files/search',
    operation: 'search files of',
    query: ['path', 'query', 'regex', 'caseSensitive', 'glob', 'maxResults'],
  });

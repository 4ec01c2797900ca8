// Who acts on which sandbox (resolved once per request by the router), and E2B's `~` paths.
// Every call into the sandbox goes through core's typed toolbox (core/services/toolbox.ts):
// scope, visibility, running state and activity are core's business.
import type { Principal } from '../../core/types.js';

export interface SandboxTarget {
  principal: Principal;
  sandboxId: string;
}

/**
 * E2B paths may start with `~` (the user's home); the toolbox resolves relative paths against
 * the home, so `~/x` becomes `x` (e2b.md (d) GET /files: "starting with ~/").
 */
export function homeRelative(path: string): string {
  if (path === '~') return '.';
  if (path.startsWith('~/')) return path.slice(2) || '.';
  return path;
}

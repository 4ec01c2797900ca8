// Who acts on which sandbox (resolved once per request by the router), and E2B's `~` paths.
// Every call into the sandbox goes through core's typed toolbox (core/services/toolbox.ts):
// scope, visibility, running state and activity are core's business.
import type { Principal } from '../../core/types.js';
import { inHome } from '../sandbox-accounts.js';

export interface SandboxTarget {
  principal: Principal;
  sandboxId: string;
}

/**
 * E2B paths may start with `~` (the user's home, e2b.md (d) GET /files: "starting with ~/").
 * With the home of the account the request acts as (compat/sandbox-accounts.ts), `~`, `~/x` and
 * relative paths become absolute paths in it; without, `~/x` becomes `x` (the agent's home).
 */
export function homeRelative(path: string, home?: string): string {
  if (home !== undefined) return inHome(path, home);
  if (path === '~') return '.';
  if (path.startsWith('~/')) return path.slice(2) || '.';
  return path;
}

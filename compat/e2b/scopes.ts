// The scope each E2B control-plane route needs (compat/scope-gate.ts), in registration order.
// test/scopes.test.ts compares this list with the router's own routes: a new route without an
// entry fails it. Core checks again (connect resumes only with sandboxes:operate, and so on).
import type { ScopeTable } from '../scope-gate.js';

export const E2B_CONTROL_PLANE_SCOPES: ScopeTable = [
  ['POST /sandboxes', 'sandboxes:create'],
  ['POST /v2/sandboxes', 'sandboxes:create'],
  ['GET /sandboxes', 'sandboxes:read'],
  ['GET /v2/sandboxes', 'sandboxes:read'],
  ['GET /sandboxes/metrics', 'sandboxes:read'],
  ['GET /sandboxes/:sandboxID', 'sandboxes:read'],
  ['DELETE /sandboxes/:sandboxID', 'sandboxes:delete'],
  ['POST /sandboxes/:sandboxID/timeout', 'sandboxes:operate'],
  ['POST /sandboxes/:sandboxID/refreshes', 'sandboxes:operate'],
  ['POST /sandboxes/:sandboxID/pause', 'sandboxes:operate'],
  ['POST /sandboxes/:sandboxID/resume', 'sandboxes:operate'],
  // Connecting to a running sandbox only reads it (and hands out a token limited to the key's
  // scopes); resuming a paused one needs sandboxes:operate, which core checks.
  ['POST /sandboxes/:sandboxID/connect', 'sandboxes:read'],
  ['POST /v2/sandboxes/:sandboxID/connect', 'sandboxes:read'],
  ['GET /sandboxes/:sandboxID/metrics', 'sandboxes:read'],
  ['GET /sandboxes/:sandboxID/logs', 'sandboxes:read'],
  ['GET /v2/sandboxes/:sandboxID/logs', 'sandboxes:read'],
  ['PUT /sandboxes/:sandboxID/network', 'sandboxes:operate'],
  ['POST /sandboxes/:sandboxID/snapshots', 'snapshots:write'],
  ['GET /snapshots', 'snapshots:read'],
  ['DELETE /templates/:templateID', 'snapshots:write'],
  ['POST /sandboxes/:sandboxID/fork', 'sandboxes:create'],
  // Areas Nestbox does not have: any valid key is told "not supported".
  ['ALL /templates', 'authenticated'],
  ['ALL /templates/*rest', 'authenticated'],
  ['ALL /v2/templates', 'authenticated'],
  ['ALL /v2/templates/*rest', 'authenticated'],
  ['ALL /v3/templates', 'authenticated'],
  ['ALL /v3/templates/*rest', 'authenticated'],
  ['ALL /volumes', 'authenticated'],
  ['ALL /volumes/*rest', 'authenticated'],
  ['ALL /secrets', 'authenticated'],
  ['ALL /secrets/*rest', 'authenticated'],
];

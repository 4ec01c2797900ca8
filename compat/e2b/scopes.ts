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
  // Templates (templates.ts). The upload links' PUT is no route here: it is authorised by the
  // link's own token, ahead of the key check (templateUploadMiddleware).
  ['POST /v3/templates', 'images:write'],
  ['POST /v2/templates', 'images:write'],
  ['GET /templates/aliases/:alias', 'images:read'],
  ['POST /templates/tags', 'images:write'],
  ['DELETE /templates/tags', 'images:write'],
  ['GET /templates/:templateID/files/:hash', 'images:write'],
  ['POST /v2/templates/:templateID/builds/:buildID', 'images:write'],
  ['GET /templates/:templateID/builds/:buildID/status', 'images:read'],
  ['GET /templates/:templateID/tags', 'images:read'],
  // A named snapshot or a template's image (core checks images:write for the latter).
  ['DELETE /templates/:templateID', 'snapshots:write'],
  ['POST /sandboxes/:sandboxID/fork', 'sandboxes:create'],
  // Lifecycle events and webhooks (events.ts).
  ['GET /events/sandboxes', 'sandboxes:read'],
  ['GET /events/sandboxes/:sandboxID', 'sandboxes:read'],
  ['POST /events/webhooks', 'webhooks:manage'],
  ['GET /events/webhooks', 'webhooks:manage'],
  ['GET /events/webhooks/:webhookID', 'webhooks:manage'],
  ['PATCH /events/webhooks/:webhookID', 'webhooks:manage'],
  ['DELETE /events/webhooks/:webhookID', 'webhooks:manage'],
  // Areas Nestbox does not have: any valid key is told "not supported".
  ['ALL /templates', 'authenticated'],
  ['ALL /templates/*rest', 'authenticated'],
  ['ALL /v2/templates', 'authenticated'],
  ['ALL /v2/templates/*rest', 'authenticated'],
  ['ALL /v3/templates', 'authenticated'],
  ['ALL /v3/templates/*rest', 'authenticated'],
  ['POST /volumes', 'volumes:write'],
  ['GET /volumes', 'volumes:read'],
  ['GET /volumes/:volumeID', 'volumes:read'],
  ['DELETE /volumes/:volumeID', 'volumes:write'],
  // Organisation secrets (secrets.ts).
  ['GET /secrets', 'secrets:manage'],
  ['POST /secrets', 'secrets:manage'],
  ['GET /secrets/:secretID', 'secrets:manage'],
  ['POST /secrets/:secretID', 'secrets:manage'],
  ['DELETE /secrets/:secretID', 'secrets:manage'],
];

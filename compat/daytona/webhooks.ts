// Daytona's webhooks API (api-client WebhooksApi) onto Nestbox webhooks (core/services/webhooks.ts).
// Daytona runs its webhooks on Svix: an organisation is "initialised" (a Svix application is
// made), endpoints are managed in Svix's app portal, and message attempts are Svix records.
// Nestbox keeps webhooks itself, per organisation, managed through the native API
// (/api/v1/webhooks); so an organisation needs no initialisation, there is no portal, and a
// message's attempts are its delivery records.
import type { RequestHandler, Request, Response, Router } from 'express';
import { errors } from '../../core/errors.js';
import type { CompatPort } from '../../core/compat-port.js';
import type { Principal } from '../../core/types.js';
import { notSupported } from './errors.js';

type Api = (fn: (req: Request, res: Response, principal: Principal) => Promise<void>) => RequestHandler;

/** Svix's attempt status codes, as Daytona's dashboard reads them. */
const SVIX_STATUS = { delivered: 0, pending: 1, failed: 2 } as const;

/** The path's organisation must be the key's (another one is simply not found). */
function ownOrganization(principal: Principal, req: Request): string {
  const id = String(req.params.organizationId);
  if (id !== principal.organizationId) throw errors.notFound('organization', id);
  return id;
}

export function registerWebhookRoutes(router: Router, webhooks: CompatPort['webhooks'], api: Api): void {
  // Webhooks are always available on a Nestbox server.
  router.get('/webhooks/status', api(async (_req, res, principal) => {
    await webhooks.list(principal);
    res.status(200).json({ enabled: true });
  }));
  // Nothing to initialise (no Svix application): the organisation's webhooks exist already; 201 as Daytona answers.
  router.post('/webhooks/organizations/:organizationId/initialize', api(async (req, res, principal) => {
    ownOrganization(principal, req);
    await webhooks.list(principal);
    res.status(201).end();
  }));
  router.get('/webhooks/organizations/:organizationId/initialization-status', api(async (req, res, principal) => {
    const organizationId = ownOrganization(principal, req);
    const hooks = await webhooks.list(principal);
    const first = hooks[0]?.createdAt.toISOString() ?? new Date(0).toISOString();
    const last = hooks.reduce((at, h) => (h.updatedAt.toISOString() > at ? h.updatedAt.toISOString() : at), first);
    res.status(200).json({ organizationId, svixApplicationId: null, endpointsCreated: hooks.length > 0, svixApplicationCreated: false, lastError: null, retryCount: 0, createdAt: first, updatedAt: last });
  }));
  // A message is an event (its id is the webhook-id header); its attempts are its deliveries, one per webhook and replay (each with its latest attempt).
  router.get('/webhooks/organizations/:organizationId/messages/:messageId/attempts', api(async (req, res, principal) => {
    ownOrganization(principal, req);
    const deliveries = await webhooks.deliveriesOfMessage(principal, String(req.params.messageId));
    const hooks = new Map((await webhooks.list(principal)).map((h) => [h.id, h]));
    res.status(200).json(
      deliveries.map((d) => ({
        id: d.id,
        msgId: d.messageId,
        endpointId: d.webhookId,
        url: hooks.get(d.webhookId)?.url ?? null,
        status: SVIX_STATUS[d.status],
        responseStatusCode: d.responseStatus ?? 0,
        response: d.lastError ?? '',
        attempts: d.attempts,
        timestamp: (d.lastAttemptAt ?? d.createdAt).toISOString(),
        triggerType: 0,
      })),
    );
  }));
  router.post('/webhooks/organizations/:organizationId/send', api(async (req, _res, principal) => {
    ownOrganization(principal, req);
    throw notSupported('sending custom webhook messages', 'Nestbox webhooks carry the platform\'s lifecycle events only (replay one with POST /api/v1/webhooks/{id}/events/{eventId}/replay)');
  }));
  router.post('/webhooks/organizations/:organizationId/app-portal-access', api(async (req, _res, principal) => {
    ownOrganization(principal, req);
    throw notSupported('the webhooks app portal', 'Nestbox has no Svix portal; webhooks are managed through the native API (/api/v1/webhooks)');
  }));
}

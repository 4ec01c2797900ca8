// JSON of lifecycle events, sandbox log entries, webhooks and deliveries on the native API.
import { renderEvent, type SandboxLogEntry } from '../../../core/services/events.js';
import type { DeliveryRecord, WebhookRecord } from '../../../core/services/webhooks.js';

export { renderEvent };

export const renderLogEntry = (e: SandboxLogEntry) => ({ timestamp: e.timestamp.toISOString(), level: e.level, message: e.message, fields: e.fields });

export const renderWebhook = (w: WebhookRecord) => ({
  id: w.id,
  url: w.url,
  eventTypes: w.eventTypes,
  enabled: w.enabled,
  description: w.description,
  signingScheme: w.signingScheme,
  createdAt: w.createdAt.toISOString(),
  updatedAt: w.updatedAt.toISOString(),
});

const iso = (d: Date | null) => (d ? d.toISOString() : null);

export const renderDelivery = (d: DeliveryRecord) => ({
  id: d.id,
  webhookId: d.webhookId,
  messageId: d.messageId,
  eventId: d.eventId,
  eventType: d.eventType,
  status: d.status,
  sending: d.sending,
  attempts: d.attempts,
  lastError: d.lastError,
  responseStatus: d.responseStatus,
  createdAt: d.createdAt.toISOString(),
  lastAttemptAt: iso(d.lastAttemptAt),
  nextAttemptAt: iso(d.nextAttemptAt),
  deliveredAt: iso(d.deliveredAt),
});

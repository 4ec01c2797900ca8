// Daytona's webhooks API through the real generated client (@daytonaio/api-client WebhooksApi):
// status, initialize, initialization-status and message attempts over Nestbox's own webhooks and
// delivery records; send and app-portal-access are refused with the reason (501).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Configuration, WebhooksApi } from '@daytonaio/api-client';
import { startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';
import { waitFor } from '../../test/harness.js';
import { startReceiver } from '../../test/webhook-receiver.js';

let env: DaytonaTestEnv;
let api: WebhooksApi;
let organizationId: string;

beforeAll(async () => {
  env = await startDaytonaEnv({ NESTBOX_WEBHOOK_ALLOW_PRIVATE_TARGETS: 'true' });
  api = new WebhooksApi(new Configuration({ basePath: env.apiUrl, baseOptions: { headers: { Authorization: `Bearer ${env.server.apiKey}` } } }));
  organizationId = ((await env.server.server.db('api_keys').first('organization_id')) as { organization_id: string }).organization_id;
});
afterAll(async () => {
  await env?.server.close();
});

describe('daytona webhooks API', () => {
  it('reports status and initialisation, and a message’s attempts from the delivery records', async () => {
    expect((await api.webhookControllerGetStatus()).data).toEqual({ enabled: true });
    expect((await api.webhookControllerInitializeWebhooks(organizationId)).status).toBe(201);
    const before = (await api.webhookControllerGetInitializationStatus(organizationId)).data;
    expect(before).toMatchObject({ organizationId, lastError: null, retryCount: 0, endpointsCreated: false });

    const receiver = await startReceiver();
    try {
      const hook = await env.server.http.post('/api/v1/webhooks').set(env.server.auth).send({ url: receiver.url });
      expect(hook.status).toBe(201);
      expect((await api.webhookControllerGetInitializationStatus(organizationId)).data).toMatchObject({ endpointsCreated: true });
      const ping = await env.server.http.post(`/api/v1/webhooks/${hook.body.id}/ping`).set(env.server.auth);
      await waitFor('the ping delivered', async () => receiver.received.length >= 1);
      const attempts = await waitFor('the attempt recorded', async () => {
        const res = (await api.webhookControllerGetMessageAttempts(organizationId, ping.body.messageId)).data as { status: number }[];
        return res[0]?.status === 0 ? res : undefined;
      });
      expect(attempts).toEqual([expect.objectContaining({ msgId: ping.body.messageId, endpointId: hook.body.id, url: receiver.url, status: 0, responseStatusCode: 200 })]);
    } finally {
      await receiver.close();
    }

    // Another organisation's id is not found; Svix-only features are refused with the reason.
    await expect(api.webhookControllerGetInitializationStatus('org-not-mine')).rejects.toMatchObject({ response: { status: 404 } });
    await expect(api.webhookControllerGetAppPortalAccess(organizationId)).rejects.toMatchObject({ response: { status: 501 } });
    await expect(api.webhookControllerSendWebhook(organizationId, { eventType: 'x', payload: {} })).rejects.toMatchObject({ response: { status: 501 } });
  });
});

// Control plane through the real @daytonaio/sdk 0.218 (daytona.md (b)).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  DaytonaError, DaytonaNotFoundError, DaytonaConflictError, DaytonaValidationError, DaytonaAuthenticationError, Daytona,
  type CreateSandboxFromSnapshotParams,
} from '@daytonaio/sdk';
import { rawFetch, startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

// The SDK's types allow `resources` only next to an `image`, but its create() sends them with the
// default snapshot too (what these tests pin), so those params are cast to the snapshot form.
describe('Daytona control plane with @daytonaio/sdk', () => {
  let env: DaytonaTestEnv;
  beforeAll(async () => {
    env = await startDaytonaEnv();
  });
  afterAll(async () => {
    await env?.server.close();
  });

  it('creates a started sandbox with labels, env, name and resources, and gets it by id and by name', async () => {
    const sb = await env.daytona.create({ name: 'cp-one', labels: { team: 'x' }, envVars: { GREETING: 'hi' }, resources: { cpu: 1, memory: 1 }, autoStopInterval: 30, autoDeleteInterval: -1 } as CreateSandboxFromSnapshotParams);
    expect(sb.id).toMatch(/^[a-z0-9]+$/);
    expect(sb.state).toBe('started');
    expect(sb.name).toBe('cp-one');
    expect(sb.labels).toMatchObject({ team: 'x', 'code-toolbox-language': 'python' });
    expect(sb.cpu).toBe(1);
    expect(sb.memory).toBe(1);
    expect(sb.autoStopInterval).toBe(30);
    expect(sb.autoDeleteInterval).toBe(-1);
    expect(sb.toolboxProxyUrl).toBe(`${env.server.url}/daytona/toolbox`);
    expect((sb as unknown as { env: Record<string, string> }).env).toEqual({ GREETING: 'hi' });

    const byId = await env.daytona.get(sb.id);
    expect(byId.id).toBe(sb.id);
    const byName = await env.daytona.get('cp-one');
    expect(byName.id).toBe(sb.id);
    // The environment reaches processes.
    expect((await byName.process.executeCommand('echo $GREETING')).result.trim()).toBe('hi');
  });

  it('refuses a second sandbox with the same name (409) and bad input (400) with the SDK error classes', async () => {
    await expect(env.daytona.create({ name: 'cp-one' })).rejects.toBeInstanceOf(DaytonaConflictError);
    await expect(env.daytona.create({ resources: { cpu: 999 } } as CreateSandboxFromSnapshotParams)).rejects.toBeInstanceOf(DaytonaValidationError);
    const err = await env.daytona.create({ name: 'bad name!' }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DaytonaValidationError);
    expect((err as Error).message).toMatch(/^name:/);
  });

  it('answers not found with DaytonaNotFoundError and a bad key with DaytonaAuthenticationError', async () => {
    await expect(env.daytona.get('does-not-exist')).rejects.toBeInstanceOf(DaytonaNotFoundError);
    const bad = new Daytona({ apiUrl: env.apiUrl, apiKey: 'nbx_' + 'x'.repeat(40) });
    await expect(bad.get('whatever')).rejects.toBeInstanceOf(DaytonaAuthenticationError);
  });

  it('lists with label filters, states and cursor paging', async () => {
    const a = await env.daytona.create({ labels: { group: 'paging' } });
    const b = await env.daytona.create({ labels: { group: 'paging' } });
    const seen: string[] = [];
    for await (const item of env.daytona.list({ labels: { group: 'paging' } })) seen.push(item.id);
    expect(seen.sort()).toEqual([a.id, b.id].sort());
    const page = await rawFetch(env, `/daytona/api/sandbox?limit=1&labels=${encodeURIComponent(JSON.stringify({ group: 'paging' }))}`);
    const body = (await page.json()) as { items: { id: string; toolboxProxyUrl: string; env?: unknown }[]; nextCursor: string | null };
    expect(body.items).toHaveLength(1);
    expect(body.items[0].toolboxProxyUrl).toBe(`${env.server.url}/daytona/toolbox`);
    expect(body.items[0].env).toBeUndefined();
    expect(body.nextCursor).toBeTruthy();
    const stopped = await rawFetch(env, `/daytona/api/sandbox?states=stopped&labels=${encodeURIComponent(JSON.stringify({ group: 'paging' }))}`);
    expect(((await stopped.json()) as { items: unknown[] }).items).toHaveLength(0);
    const sorted = await rawFetch(env, `/daytona/api/sandbox?sort=createdAt&order=asc&labels=${encodeURIComponent(JSON.stringify({ group: 'paging' }))}`);
    expect(((await sorted.json()) as { items: { id: string }[] }).items.map((i) => i.id)).toEqual([a.id, b.id]);
    // A trailing slash in DAYTONA_API_URL gives `//` (daytona.md (h) 11).
    expect((await rawFetch(env, `/daytona/api//sandbox/${a.id}`)).status).toBe(200);
    await a.delete();
    await b.delete();
  });

  it('sets labels and the autostop / autodelete / ttl intervals, and refreshes activity', async () => {
    const sb = await env.daytona.create();
    await sb.setLabels({ a: 'b' });
    expect(sb.labels).toEqual({ a: 'b' });
    await sb.setAutostopInterval(5);
    await sb.setAutoDeleteInterval(60);
    await sb.refreshData();
    expect(sb.autoStopInterval).toBe(5);
    expect(sb.autoDeleteInterval).toBe(60);
    await sb.setAutoPauseInterval(7);
    await sb.refreshData();
    expect(sb.autoPauseInterval).toBe(7);
    expect(sb.autoStopInterval).toBe(0);
    await sb.setAutoDeleteInterval(-1);
    await sb.setTtl(30);
    await sb.refreshData();
    expect(sb.autoDestroyAt).toBeTruthy();
    await sb.setAutoArchiveInterval(10);
    const before = sb.lastActivityAt;
    await new Promise((r) => setTimeout(r, 5100));
    await sb.refreshActivity();
    await sb.refreshData();
    expect(new Date(sb.lastActivityAt!).getTime()).toBeGreaterThan(new Date(before!).getTime());
    await sb.delete();
  });

  it('stops, starts, archives, recovers and pauses through the SDK waits', async () => {
    const sb = await env.daytona.create();
    await sb.process.executeCommand('echo kept > /home/daytona/kept.txt');
    await sb.stop();
    expect(sb.state).toBe('stopped');
    await sb.start();
    expect(sb.state).toBe('started');
    expect((await sb.process.executeCommand('cat /home/daytona/kept.txt')).result.trim()).toBe('kept');
    await sb.archive();
    expect(sb.state).toBe('stopped');
    await sb.recover();
    expect(sb.state).toBe('started');
    await sb.pause();
    expect(sb.state).toBe('paused');
    await sb.start();
    expect(sb.state).toBe('started');
    await sb.stop(60, true);
    expect(sb.state).toBe('stopped');
    await sb.delete(60, true);
    await expect(env.daytona.get(sb.id)).rejects.toBeInstanceOf(DaytonaNotFoundError);
  });

  it('forks a sandbox with its disk, under a new name', async () => {
    const sb = await env.daytona.create();
    await sb.fs.uploadFile(Buffer.from('forked data'), '/home/daytona/f.txt');
    const child = await sb.fork({ name: 'cp-child' });
    expect(child.id).not.toBe(sb.id);
    expect(child.name).toBe('cp-child');
    expect(child.state).toBe('started');
    expect((await child.fs.downloadFile('/home/daytona/f.txt')).toString()).toBe('forked data');
    await child.delete();
    await sb.delete();
  });

  it('takes a named snapshot and creates a sandbox from it; lists, gets and deletes snapshots', async () => {
    const sb = await env.daytona.create();
    await sb.process.executeCommand('echo from-snapshot > /home/daytona/s.txt');
    await sb.createSnapshot('cp-snap');
    expect(sb.state).toBe('started');
    const snap = await env.daytona.snapshot.get('cp-snap');
    expect(snap.name).toBe('cp-snap');
    expect(snap.state).toBe('active');
    const listed = await env.daytona.snapshot.list();
    expect(listed.items.map((s) => s.name)).toContain('cp-snap');
    const fromSnap = await env.daytona.create({ snapshot: 'cp-snap' });
    expect((await fromSnap.process.executeCommand('cat /home/daytona/s.txt')).result.trim()).toBe('from-snapshot');
    await fromSnap.delete();
    await sb.delete();
    await env.daytona.snapshot.delete(snap);
    await expect(env.daytona.snapshot.get('cp-snap')).rejects.toBeInstanceOf(DaytonaNotFoundError);
  });

  it('honours or refuses every create option it knows; only unknown ones are reported as without effect', async () => {
    const res = await rawFetch(env, '/daytona/api/sandbox', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ env: {}, labels: {}, disk: 10, spot: false, kvm: false, autoArchiveInterval: 60, someFutureOption: 1 }) });
    expect(res.status).toBe(200);
    expect(res.headers.get('x-nestbox-unhonoured-options')).toBe('someFutureOption');
    const created = (await res.json()) as { id: string; disk: number; public: boolean };
    // `disk` is honoured: the sandbox's own disk of that many GiB.
    expect(created.disk).toBe(10);
    expect(created.public).toBe(false);
    await rawFetch(env, `/daytona/api/sandbox/${created.id}`, { method: 'DELETE' });
    for (const [option, text] of [
      [{ spot: true }, /spot sandboxes is not supported/],
      [{ kvm: true }, /kvm .* is not supported/],
      [{ gpuType: ['a100'] }, /gpuType is not supported/],
      [{ user: 'root' }, /user "root" .* is not supported/],
      [{ outboundProxyUrl: 'http://127.0.0.1:1' }, /outboundProxyUrl is not supported/],
      [{ otelEndpointOverride: 'http://127.0.0.1:1' }, /otelEndpointOverride is not supported/],
    ] as const) {
      const refused = await rawFetch(env, '/daytona/api/sandbox', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(option) });
      expect(refused.status).toBe(501);
      expect(((await refused.json()) as { message: string }).message).toMatch(text);
    }
    const both = await rawFetch(env, '/daytona/api/sandbox', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ autoStopInterval: 5, autoPauseInterval: 5 }) });
    expect(both.status).toBe(400);
    expect(((await both.json()) as { message: string }).message).toMatch(/autoStopInterval/);

    // Volumes (create({volumes}), daytona.volume.*) are supported: volumes.test.ts.
    // Images (create({image}), snapshot.create) are built: images.test.ts.

    const sb = await env.daytona.create();
    // Resize is live (resize.test.ts has the rest): the SDK applies the answered DTO.
    await sb.resize({ cpu: 2 });
    expect(sb.cpu).toBe(2);
    const preview = await sb.getPreviewLink(3000);
    expect(preview.url).toContain(sb.id);
    expect(preview.url).toContain('3000');
    expect(preview.token).toMatch(/^nbxp_/);
    // Traffic through preview links: the link's token, a signed URL, and refusals.
    await sb.process.executeCommand('mkdir -p /home/daytona/srv && echo preview-ok > /home/daytona/srv/index.html && cd /home/daytona/srv && (nohup python3 -m http.server 3000 --bind 0.0.0.0 >/dev/null 2>&1 &)');
    const viaToken = await waitForOk(() => fetch(preview.url, { headers: { 'X-Nestbox-Port-Token': preview.token } }));
    expect(await viaToken.text()).toBe('preview-ok\n');
    const signed = await sb.getSignedPreviewUrl(3000, 60);
    expect(signed.url).toContain('_token=nbxs_');
    const viaSigned = await fetch(signed.url);
    expect(viaSigned.status).toBe(200);
    expect(await viaSigned.text()).toBe('preview-ok\n');
    expect((await fetch(signed.url.replace(/.$/, (c) => (c === 'A' ? 'B' : 'A')))).status).toBe(401);
    const shortLived = await sb.getSignedPreviewUrl(3000, 1);
    await new Promise((r) => setTimeout(r, 2100));
    expect((await fetch(shortLived.url)).status).toBe(401);
    await expect(sb.expireSignedPreviewUrl(3000, signed.token)).rejects.toThrow(/not supported/);
    await expect(sb.createSshAccess(10)).rejects.toThrow(/SSH access/);
    await sb.delete();
  });

  it('opens every preview link of a public sandbox to anyone, and closes them again', async () => {
    const sb = await env.daytona.create({ public: true });
    try {
      expect(sb.public).toBe(true);
      await sb.process.executeCommand('mkdir -p /tmp/pub && echo public-ok > /tmp/pub/index.html && cd /tmp/pub && (nohup python3 -m http.server 3001 --bind 0.0.0.0 >/dev/null 2>&1 &)');
      const url = `${env.server.url}/p/${sb.id}/3001/`;
      // No token, and the port was never asked for a preview link.
      const open = await waitForOk(() => fetch(url));
      expect(await open.text()).toBe('public-ok\n');
      expect(((await (await rawFetch(env, '/daytona/api/sandbox')).json()) as { items: { id: string; public: boolean }[] }).items.find((i) => i.id === sb.id)?.public).toBe(true);
      expect((await rawFetch(env, `/daytona/api/sandbox/${sb.id}/public/false`, { method: 'POST' })).status).toBe(200);
      // Closed: a port without a preview link of its own is not served at all.
      expect((await fetch(url)).status).toBe(404);
      expect((await env.daytona.get(sb.id)).public).toBe(false);
      // A preview link's own token still opens its port.
      const preview = await sb.getPreviewLink(3001);
      expect((await fetch(preview.url, { headers: { 'X-Nestbox-Port-Token': preview.token } })).status).toBe(200);
      expect(((await (await rawFetch(env, `/daytona/api/sandbox/${sb.id}/public/true`, { method: 'POST' })).json()) as { public: boolean }).public).toBe(true);
      expect((await fetch(url)).status).toBe(200);
    } finally {
      await sb.delete();
    }
  });

  it('serves /config without auth and the toolbox-proxy-url', async () => {
    const config = await fetch(`${env.apiUrl}/config`);
    expect(config.status).toBe(200);
    expect(((await config.json()) as { proxyToolboxUrl: string }).proxyToolboxUrl).toBe(`${env.server.url}/daytona/toolbox`);
    const sb = await env.daytona.create();
    const proxy = await rawFetch(env, `/daytona/api/sandbox/${sb.id}/toolbox-proxy-url`);
    expect(await proxy.json()).toEqual({ url: `${env.server.url}/daytona/toolbox` });
    const err = await rawFetch(env, '/daytona/api/sandbox/nope');
    expect(err.status).toBe(404);
    expect(await err.json()).toMatchObject({ statusCode: 404, message: 'sandbox nope not found', error: 'Not Found' });
    await sb.delete();
  });
});

/** Retries until the proxied service answers 200 (it was just started in the background). */
async function waitForOk(request: () => Promise<Response>): Promise<Response> {
  let last: Response | undefined;
  for (let attempt = 0; attempt < 50; attempt++) {
    last = await request().catch(() => undefined);
    if (last?.status === 200) return last;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`still ${last?.status} after 10 s`);
}

// An older SDK generation: e2b 2.6.0 (installed as `e2b-legacy`). It creates with the v1
// `POST /sandboxes` (always sending timeout, secure and allow_internet_access) and connects
// with `POST /sandboxes/{id}/connect` (e2b.md (a) "Version matrix"). It predates
// E2B_SANDBOX_URL (2.7.0), so its envd traffic can only reach per-sandbox host names; this
// file covers its control plane, plus the header-less /files fallback old SDKs rely on.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox, SandboxError } from 'e2b-legacy';
import { startE2bTestServer, type E2bTestServer } from './helpers.js';

let t: E2bTestServer;
let opts: { apiKey: string; apiUrl: string };

beforeAll(async () => {
  t = await startE2bTestServer();
  opts = { apiKey: t.opts.apiKey, apiUrl: t.opts.apiUrl };
});

afterAll(async () => {
  await t?.close();
});

describe('e2b 2.6.0 (v1 routes)', () => {
  it('creates, lists, sets the timeout, pauses, connects and kills', async () => {
    const sbx = await Sandbox.create({ ...opts, metadata: { sdk: 'legacy' }, timeoutMs: 90_000 });
    expect(sbx.sandboxId).toMatch(/^[a-z0-9]+$/);
    const info = await Sandbox.getInfo(sbx.sandboxId, opts);
    expect(info.metadata).toEqual({ sdk: 'legacy' });
    expect(info.state).toBe('running');
    expect(info.endAt.getTime() - Date.now()).toBeLessThanOrEqual(90_000);

    const listed = await Sandbox.list({ ...opts, query: { metadata: { sdk: 'legacy' } } }).nextItems();
    expect(listed.map((s) => s.sandboxId)).toEqual([sbx.sandboxId]);

    await Sandbox.setTimeout(sbx.sandboxId, 20_000, opts);
    expect((await Sandbox.getInfo(sbx.sandboxId, opts)).endAt.getTime() - Date.now()).toBeLessThanOrEqual(20_000);

    expect(await Sandbox.betaPause(sbx.sandboxId, opts)).toBe(true);
    expect((await Sandbox.getInfo(sbx.sandboxId, opts)).state).toBe('paused');
    // 2.6 connect: POST /sandboxes/{id}/connect with {"timeout":300} resumes it.
    const resumed = await Sandbox.connect(sbx.sandboxId, opts);
    expect(resumed.sandboxId).toBe(sbx.sandboxId);
    expect((await Sandbox.getInfo(sbx.sandboxId, opts)).state).toBe('running');

    expect(await Sandbox.kill(sbx.sandboxId, opts)).toBe(true);
    expect(await Sandbox.kill(sbx.sandboxId, opts)).toBe(false);
    // 2.6's getInfo has no not-found class of its own: a SandboxError with the 404 in its message.
    const err = await Sandbox.getInfo(sbx.sandboxId, opts).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SandboxError);
    expect(String((err as Error).message)).toMatch(/^404: sandbox \w+ not found/);
  });

  it('serves /files and /health by access token alone (e2b 2.7–2.14 send no routing headers there)', async () => {
    const res = await fetch(`${t.opts.apiUrl}/sandboxes`, {
      method: 'POST',
      headers: { 'X-API-KEY': t.apiKey, 'content-type': 'application/json' },
      body: JSON.stringify({ templateID: 'base', timeout: 120, secure: true, allow_internet_access: true }),
    });
    expect(res.status).toBe(201);
    const created = (await res.json()) as { sandboxID: string; envdAccessToken: string; envdVersion: string };
    expect(created.envdAccessToken).toBeTruthy();
    expect(created.envdVersion).toMatch(/^\d+\.\d+\.\d+$/);

    const form = new FormData();
    form.append('file', new Blob(['no headers']), '/tmp/legacy.txt');
    const up = await fetch(`${t.url}/files?path=${encodeURIComponent('/tmp/legacy.txt')}`, { method: 'POST', headers: { 'X-Access-Token': created.envdAccessToken }, body: form });
    expect(up.status).toBe(200);
    expect(await up.json()).toEqual([{ name: 'legacy.txt', type: 'file', path: '/tmp/legacy.txt' }]);
    const down = await fetch(`${t.url}/files?path=${encodeURIComponent('/tmp/legacy.txt')}`, { headers: { 'X-Access-Token': created.envdAccessToken } });
    expect(await down.text()).toBe('no headers');
    const health = await fetch(`${t.url}/health`, { headers: { 'X-Access-Token': created.envdAccessToken } });
    expect(health.status).toBe(204);

    // GET /sandboxes/{id} hands the same token out again (1.x and 2.0–2.5 connect read it there).
    const detail = (await (await fetch(`${t.opts.apiUrl}/sandboxes/${created.sandboxID}`, { headers: { 'X-API-KEY': t.apiKey } })).json()) as { envdAccessToken: string };
    expect(detail.envdAccessToken).toBe(created.envdAccessToken);
    // v1 list (GET /sandboxes) is a plain array of running sandboxes.
    const v1 = (await (await fetch(`${t.opts.apiUrl}/sandboxes`, { headers: { 'X-API-KEY': t.apiKey } })).json()) as { sandboxID: string }[];
    expect(v1.map((s) => s.sandboxID)).toContain(created.sandboxID);
    // 2.0–2.5 resume: a running sandbox is "not paused" → body code 409.
    const resume = await fetch(`${t.opts.apiUrl}/sandboxes/${created.sandboxID}/resume`, { method: 'POST', headers: { 'X-API-KEY': t.apiKey, 'content-type': 'application/json' }, body: '{"timeout":60}' });
    expect(resume.status).toBe(409);
    expect(await resume.json()).toMatchObject({ code: 409 });

    const gone = await fetch(`${t.opts.apiUrl}/sandboxes/${created.sandboxID}`, { method: 'DELETE', headers: { 'X-API-KEY': t.apiKey } });
    expect(gone.status).toBe(204);
    // Gone: 502, as E2B's proxy answers for a dead sandbox (isRunning() → false); a wrong token stays 401.
    const after = await fetch(`${t.url}/health`, { headers: { 'X-Access-Token': created.envdAccessToken } });
    expect(after.status).toBe(502);
    expect((await fetch(`${t.url}/health`, { headers: { 'X-Access-Token': 'not-a-token' } })).status).toBe(401);
  });
});

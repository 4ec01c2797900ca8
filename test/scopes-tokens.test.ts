// Every token or signed URL a key can obtain (issue 11, finding 2 and the scope tests): E2B envd
// access tokens and signed /files URLs, Daytona signing keys and signed file URLs, hosted-port
// tokens and signed preview URLs. Each carries no more than its key's scopes, has a bounded
// lifetime, and stops working when the key is revoked or the sandbox deleted. Also finding 11:
// /health does not tell an unauthenticated caller which sandboxes exist, and a key limited to
// one sandbox sees only that sandbox's snapshots.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Code, ConnectError, createClient, type Client } from '@connectrpc/connect';
import { createConnectTransport } from '@connectrpc/connect-node';
import { Sandbox as E2bSandbox } from 'e2b';
import { startTestServer, waitFor, type TestServer } from './harness.js';
import { makeKey, type TestKey } from './scope-keys.js';
import { KEY_PRESETS } from '../core/services/auth.js';
import { Process, Signal } from '../compat/e2b/gen/process/process_pb.js';
import { Filesystem } from '../compat/e2b/gen/filesystem/filesystem_pb.js';
import { fileSignature } from '../compat/e2b/routing.js';
import { fileUrlSignature } from '../compat/daytona/signing.js';

/** Short lifetimes so the bounds are testable; the token TTL must exceed the URL maximum. */
const SIGNED_URL_MAX = 600;
const TOKEN_TTL = 3600;

let t: TestServer;
let sandboxA: string;
let sandboxB: string;
let reader: TestKey;
let worker: TestKey;

beforeAll(async () => {
  t = await startTestServer({ env: { NESTBOX_SIGNED_URL_MAX_SECONDS: String(SIGNED_URL_MAX), NESTBOX_SANDBOX_TOKEN_TTL_SECONDS: String(TOKEN_TTL) } });
  const ids: string[] = [];
  for (const name of ['a', 'b']) {
    const res = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ labels: { suite: 'scope-tokens', name }, egress: { mode: 'deny-all' } });
    expect(res.status, JSON.stringify(res.body)).toBe(201);
    ids.push(res.body.id);
  }
  [sandboxA, sandboxB] = ids;
  reader = await makeKey(t, KEY_PRESETS['read-only']);
  worker = await makeKey(t, KEY_PRESETS.sandbox);
  const put = await t.http.put(`/api/v1/sandboxes/${sandboxA}/files`).query({ path: '/tmp/scope.txt' }).set(t.auth).set('content-type', 'application/octet-stream').send(Buffer.from('scoped'));
  expect(put.status, JSON.stringify(put.body)).toBeLessThan(300);
});
afterAll(async () => {
  await t?.close();
});

const now = () => Math.floor(Date.now() / 1000);

async function revoke(key: TestKey): Promise<void> {
  const row = (await t.server.db('api_keys').where({ id: key.id }).first()) as { organization_id: string };
  await t.server.services.auth.revokeApiKey(row.organization_id, key.id);
}

async function e2bDetail(key: string, id: string): Promise<{ status: number; body: { envdAccessToken?: string; code?: number } }> {
  const res = await fetch(`${t.url}/e2b/sandboxes/${id}`, { headers: { 'X-API-KEY': key } });
  return { status: res.status, body: (await res.json()) as { envdAccessToken?: string } };
}

async function envdToken(key: string, id: string): Promise<string> {
  const detail = await e2bDetail(key, id);
  expect(detail.status, JSON.stringify(detail.body)).toBe(200);
  expect(detail.body.envdAccessToken).toMatch(/^nbxe_/);
  return detail.body.envdAccessToken!;
}

const envdHeaders = (id: string, token?: string): Record<string, string> => ({
  'E2b-Sandbox-Id': id,
  'E2b-Sandbox-Port': '49983',
  ...(token ? { 'X-Access-Token': token } : {}),
});

async function envdFetch(id: string, path: string, init: { method?: string; token?: string; body?: BodyInit; headers?: Record<string, string> } = {}): Promise<{ status: number; text: string }> {
  const res = await fetch(`${t.url}${path}`, { method: init.method ?? 'GET', headers: { ...envdHeaders(id, init.token), ...init.headers }, body: init.body });
  return { status: res.status, text: await res.text() };
}

function uploadForm(path: string, content: string): FormData {
  const form = new FormData();
  form.append('file', new Blob([content]), path);
  return form;
}

describe('E2B envd access tokens', () => {
  it('are handed out once per key and sandbox (reused), and differ between keys', async () => {
    const first = await envdToken(t.apiKey, sandboxA);
    expect(await envdToken(t.apiKey, sandboxA)).toBe(first);
    expect(await envdToken(reader.key, sandboxA)).not.toBe(first);
    expect(await envdToken(t.apiKey, sandboxB)).not.toBe(first);
  });

  it('from a read-only key read files and nothing else, on every envd RPC', async () => {
    const adminToken = await envdToken(t.apiKey, sandboxA);
    const readToken = await envdToken(reader.key, sandboxA);
    // A process of the admin's, for the read-only token to try to touch.
    const admin = await E2bSandbox.connect(sandboxA, { apiKey: t.apiKey, apiUrl: `${t.url}/e2b`, sandboxUrl: t.url });
    const sleeper = await admin.commands.run('sleep 600', { background: true });
    const transport = createConnectTransport({ baseUrl: t.url, httpVersion: '1.1' });
    const process = createClient(Process, transport);
    const filesystem = createClient(Filesystem, transport);
    const selector = { selector: { case: 'pid' as const, value: sleeper.pid } };

    // Each RPC of the generated service descriptors: what it needs, and a request that would act.
    type Rpc = { needs: 'read' | 'write'; run: (headers: Record<string, string>) => Promise<unknown> };
    const first = async (stream: AsyncIterable<unknown>) => {
      for await (const message of stream) return message;
      return undefined;
    };
    const deadline = () => AbortSignal.timeout(15_000);
    const rpcs: Record<string, Record<string, Rpc | 'client-streaming'>> = {
      Process: {
        start: { needs: 'write', run: (headers) => first(process.start({ process: { cmd: '/bin/touch', args: ['/tmp/started-by-reader'] } }, { headers, signal: deadline() })) },
        connect: { needs: 'read', run: (headers) => first(process.connect({ process: selector }, { headers, signal: deadline() })) },
        list: { needs: 'read', run: (headers) => process.list({}, { headers }) },
        sendInput: { needs: 'write', run: (headers) => process.sendInput({ process: selector, input: { input: { case: 'stdin', value: new TextEncoder().encode('x') } } }, { headers }) },
        // Client streaming needs HTTP/2, which this server does not speak; the SDK never uses it over HTTP/1.1.
        streamInput: 'client-streaming',
        sendSignal: { needs: 'write', run: (headers) => process.sendSignal({ process: selector, signal: Signal.SIGKILL }, { headers }) },
        update: { needs: 'write', run: (headers) => process.update({ process: selector, pty: { size: { cols: 100, rows: 30 } } }, { headers }) },
        closeStdin: { needs: 'write', run: (headers) => process.closeStdin({ process: selector }, { headers }) },
      },
      Filesystem: {
        stat: { needs: 'read', run: (headers) => filesystem.stat({ path: '/tmp/scope.txt' }, { headers }) },
        makeDir: { needs: 'write', run: (headers) => filesystem.makeDir({ path: '/tmp/made-by-reader' }, { headers }) },
        move: { needs: 'write', run: (headers) => filesystem.move({ source: '/tmp/scope.txt', destination: '/tmp/moved-by-reader' }, { headers }) },
        listDir: { needs: 'read', run: (headers) => filesystem.listDir({ path: '/tmp', depth: 1 }, { headers }) },
        remove: { needs: 'write', run: (headers) => filesystem.remove({ path: '/tmp/scope.txt' }, { headers }) },
        watchDir: { needs: 'read', run: (headers) => first(filesystem.watchDir({ path: '/tmp', recursive: false }, { headers, signal: deadline() })) },
        createWatcher: { needs: 'read', run: (headers) => filesystem.createWatcher({ path: '/tmp', recursive: false }, { headers }) },
        getWatcherEvents: { needs: 'read', run: (headers) => filesystem.getWatcherEvents({ watcherId: 'none' }, { headers }) },
        removeWatcher: { needs: 'read', run: (headers) => filesystem.removeWatcher({ watcherId: 'none' }, { headers }) },
      },
    };
    const codeOf = async (p: Promise<unknown>): Promise<Code | 'ok'> =>
      p.then(
        () => 'ok' as const,
        (err: unknown) => ConnectError.from(err).code,
      );
    for (const service of [Process, Filesystem]) {
      const table = rpcs[service.name]!;
      // Listed from the descriptor: a new RPC without a row here fails.
      expect(Object.keys(table).sort(), service.name).toEqual(service.methods.map((m) => m.localName).sort());
      for (const [name, rpc] of Object.entries(table)) {
        if (rpc === 'client-streaming') continue;
        const label = `${service.name}.${name}`;
        expect(await codeOf(rpc.run(envdHeaders(sandboxA))), `${label} without a token`).toBe(Code.Unauthenticated);
        expect(await codeOf(rpc.run(envdHeaders(sandboxB, readToken))), `${label} with sandbox A's token on B`).toBe(Code.Unauthenticated);
        const withReader = await codeOf(rpc.run(envdHeaders(sandboxA, readToken)));
        if (rpc.needs === 'write') expect(withReader, `${label} with a read-only key's token`).toBe(Code.PermissionDenied);
        else expect([Code.PermissionDenied, Code.Unauthenticated], `${label} with a read-only key's token`).not.toContain(withReader);
      }
    }
    // Nothing the read-only token tried happened.
    expect(await codeOf(filesystem.stat({ path: '/tmp/started-by-reader' }, { headers: envdHeaders(sandboxA, adminToken) }))).toBe(Code.NotFound);
    expect(await codeOf(filesystem.stat({ path: '/tmp/made-by-reader' }, { headers: envdHeaders(sandboxA, adminToken) }))).toBe(Code.NotFound);
    expect((await envdFetch(sandboxA, '/files?path=/tmp/scope.txt', { token: adminToken })).text).toBe('scoped');
    expect((await admin.commands.list()).map((p) => p.pid)).toContain(sleeper.pid);
    await sleeper.kill();

    // The same through the real SDK: a read-only key connects, reads, and cannot run commands.
    const asReader = await E2bSandbox.connect(sandboxA, { apiKey: reader.key, apiUrl: `${t.url}/e2b`, sandboxUrl: t.url });
    expect(await asReader.files.read('/tmp/scope.txt')).toBe('scoped');
    await expect(asReader.commands.run('id')).rejects.toThrow();
    await expect(asReader.files.write('/tmp/by-reader.txt', 'x')).rejects.toThrow();
  });

  it("limit plain and signed /files to the key's scopes, and bound a signed URL's lifetime", async () => {
    const readToken = await envdToken(reader.key, sandboxA);
    const adminToken = await envdToken(t.apiKey, sandboxA);
    expect((await envdFetch(sandboxA, '/files?path=/tmp/scope.txt', { token: readToken })).text).toBe('scoped');
    const upload = await envdFetch(sandboxA, '/files?path=/tmp/up-by-reader.txt', { method: 'POST', token: readToken, body: uploadForm('/tmp/up-by-reader.txt', 'x') });
    expect(upload.status, upload.text).toBe(403);
    expect(JSON.parse(upload.text)).toMatchObject({ code: 403 });

    const signed = (op: 'read' | 'write', path: string, token: string, expiration?: number) => {
      const sig = fileSignature(path, op, '', token, expiration === undefined ? undefined : String(expiration));
      return `/files?path=${encodeURIComponent(path)}&signature=${encodeURIComponent(sig)}${expiration === undefined ? '' : `&signature_expiration=${expiration}`}`;
    };
    // Signed URLs carry no headers at all: the server finds the sandbox from the signature.
    const bare = async (url: string, init: RequestInit = {}) => {
      const res = await fetch(`${t.url}${url}`, init);
      return { status: res.status, text: await res.text() };
    };
    expect((await bare(signed('read', '/tmp/scope.txt', readToken, now() + 60))).text).toBe('scoped');
    expect((await bare(signed('read', '/tmp/scope.txt', readToken))).text).toBe('scoped');
    const signedUpload = await bare(signed('write', '/tmp/up-by-reader.txt', readToken, now() + 60), { method: 'POST', body: uploadForm('/tmp/up-by-reader.txt', 'x') });
    expect(signedUpload.status, signedUpload.text).toBe(403);
    expect((await bare(signed('write', '/tmp/up-by-admin.txt', adminToken, now() + 60), { method: 'POST', body: uploadForm('/tmp/up-by-admin.txt', 'ok') })).status).toBe(200);
    // Bounded: past expiries and expiries beyond the configured maximum are refused.
    expect((await bare(signed('read', '/tmp/scope.txt', readToken, now() - 5))).status).toBe(401);
    const tooLong = await bare(signed('read', '/tmp/scope.txt', readToken, now() + SIGNED_URL_MAX + 120));
    expect(tooLong.status, tooLong.text).toBe(401);
    expect(tooLong.text).toContain(`${SIGNED_URL_MAX} seconds`);
  });

  it('expire, and a new one is handed out after', async () => {
    const key = await makeKey(t, KEY_PRESETS.sandbox);
    const token = await envdToken(key.key, sandboxA);
    expect((await envdFetch(sandboxA, '/files?path=/tmp/scope.txt', { token })).status).toBe(200);
    await t.server.db('sandbox_credentials').where({ api_key_id: key.id }).update({ expires_at: new Date(Date.now() - 1000) });
    const expired = await envdFetch(sandboxA, '/files?path=/tmp/scope.txt', { token });
    expect(expired.status, expired.text).toBe(401);
    expect(expired.text).toContain('expired');
    const fresh = await envdToken(key.key, sandboxA);
    expect(fresh).not.toBe(token);
    expect((await envdFetch(sandboxA, '/files?path=/tmp/scope.txt', { token: fresh })).status).toBe(200);
    const [{ expires_at: expiresAt }] = (await t.server.db('sandbox_credentials').where({ api_key_id: key.id }).orderBy('expires_at', 'desc').limit(1)) as { expires_at: Date }[];
    expect(new Date(expiresAt).getTime()).toBeLessThanOrEqual(Date.now() + TOKEN_TTL * 1000);
  });

  it("stop working, plain and signed, when their key is revoked", async () => {
    const key = await makeKey(t, KEY_PRESETS.sandbox);
    const token = await envdToken(key.key, sandboxA);
    const sig = fileSignature('/tmp/scope.txt', 'read', '', token, String(now() + 120));
    const url = `${t.url}/files?path=%2Ftmp%2Fscope.txt&signature=${encodeURIComponent(sig)}&signature_expiration=${now() + 120}`;
    expect((await fetch(url)).status).toBe(200);
    await revoke(key);
    expect((await envdFetch(sandboxA, '/files?path=/tmp/scope.txt', { token })).status).toBe(401);
    expect((await envdFetch(sandboxA, '/health', { token })).status).toBe(401);
    expect((await fetch(url)).status).toBe(401);
  });
});

describe('E2B /health', () => {
  it('answers an unauthenticated caller the same for a running sandbox and an unknown id', async () => {
    const running = await envdFetch(sandboxA, '/health');
    const unknown = await envdFetch('nosuchsandbox0000000', '/health');
    expect(running.status).toBe(401);
    expect(unknown).toEqual(running);
    // Another sandbox's token tells nothing either.
    expect(await envdFetch(sandboxA, '/health', { token: await envdToken(t.apiKey, sandboxB) })).toEqual(running);
    expect((await envdFetch(sandboxA, '/health', { token: await envdToken(reader.key, sandboxA) })).status).toBe(204);
  });
});

async function signingKey(key: string, id: string): Promise<{ status: number; key: string }> {
  const res = await fetch(`${t.url}/daytona/api/sandbox/${id}/signing-key`, { headers: { Authorization: `Bearer ${key}` } });
  const text = await res.text();
  return { status: res.status, key: res.ok ? (JSON.parse(text) as string) : text };
}

function daytonaSigned(id: string, op: 'download' | 'upload', key: string, path: string, expires: number | string): string {
  const method = op === 'download' ? 'GET' : 'POST';
  const route = op === 'download' ? '/files/download' : '/files/upload-v2';
  const q = new URLSearchParams({ path, expires: String(expires), signature: fileUrlSignature(key, method, path, String(expires)) });
  return `${t.url}/daytona/toolbox/${id}${route}?${q}`;
}

describe('Daytona signing keys and signed file URLs', () => {
  it("carry the fetching key's file scopes: a read-only key's URLs download but do not upload", async () => {
    const readerKey = await signingKey(reader.key, sandboxA);
    expect(readerKey.status).toBe(200);
    const adminKey = await signingKey(t.apiKey, sandboxA);
    expect(adminKey.key).not.toBe(readerKey.key);
    expect((await signingKey(reader.key, sandboxA)).key).toBe(readerKey.key);

    const down = await fetch(daytonaSigned(sandboxA, 'download', readerKey.key, '/tmp/scope.txt', now() + 60));
    expect(await down.text()).toBe('scoped');
    const up = await fetch(daytonaSigned(sandboxA, 'upload', readerKey.key, '/tmp/d-by-reader.txt', now() + 60), { method: 'POST', body: uploadForm('d.txt', 'x') });
    expect(up.status).toBe(403);
    expect(await up.json()).toMatchObject({ statusCode: 403 });
    const adminUp = await fetch(daytonaSigned(sandboxA, 'upload', adminKey.key, '/tmp/d-by-admin.txt', now() + 60), { method: 'POST', body: uploadForm('d.txt', 'ok') });
    expect(adminUp.status, await adminUp.text()).toBeLessThan(300);
    // One sandbox's key signs nothing for another.
    expect((await fetch(daytonaSigned(sandboxB, 'download', adminKey.key, '/etc/hostname', now() + 60))).status).toBe(403);
  });

  it('refuse URLs that never expire (expires=0), that expired, or that live longer than the maximum', async () => {
    const { key } = await signingKey(t.apiKey, sandboxA);
    for (const [expires, why] of [[0, 'never expires'], [now() - 5, 'expired'], [now() + SIGNED_URL_MAX + 120, `${SIGNED_URL_MAX} seconds`]] as const) {
      const res = await fetch(daytonaSigned(sandboxA, 'download', key, '/tmp/scope.txt', expires));
      expect(res.status, `expires=${expires}`).toBe(403);
      expect((await res.json()) as { message: string }).toMatchObject({ message: expect.stringContaining(why) });
    }
  });

  it('stop working when the key is revoked, or the signing keys rotated', async () => {
    const key = await makeKey(t, KEY_PRESETS.sandbox);
    const signing = await signingKey(key.key, sandboxA);
    const url = daytonaSigned(sandboxA, 'download', signing.key, '/tmp/scope.txt', now() + 120);
    expect((await fetch(url)).status).toBe(200);
    await revoke(key);
    expect((await fetch(url)).status).toBe(403);

    const before = await signingKey(worker.key, sandboxA);
    const workerUrl = daytonaSigned(sandboxA, 'download', before.key, '/tmp/scope.txt', now() + 120);
    expect((await fetch(workerUrl)).status).toBe(200);
    const rotated = await fetch(`${t.url}/daytona/api/sandbox/${sandboxA}/signing-key/rotate`, { method: 'POST', headers: { Authorization: `Bearer ${t.apiKey}` } });
    expect(rotated.status).toBe(200);
    expect((await fetch(workerUrl)).status).toBe(403);
    const after = await signingKey(worker.key, sandboxA);
    expect(after.key).not.toBe(before.key);
    expect((await fetch(daytonaSigned(sandboxA, 'download', after.key, '/tmp/scope.txt', now() + 120))).status).toBe(200);
    // Rotation invalidates others' keys, so it takes sandboxes:operate.
    const byReader = await fetch(`${t.url}/daytona/api/sandbox/${sandboxA}/signing-key/rotate`, { method: 'POST', headers: { Authorization: `Bearer ${reader.key}` } });
    expect(byReader.status).toBe(403);
  });
});

/** The proxy's answer for a private port; 502/503 mean it was let through to a port nothing listens on. */
async function portStatus(id: string, port: number, token: string): Promise<number> {
  const res = await fetch(`${t.url}/p/${id}/${port}/`, { headers: { 'X-Nestbox-Port-Token': token }, redirect: 'manual' });
  await res.arrayBuffer();
  return res.status;
}

describe('hosted-port tokens and signed preview URLs', () => {
  it("stop working when the key that minted them is revoked; signed ones are bounded", async () => {
    const key = await makeKey(t, KEY_PRESETS.sandbox);
    const published = await t.http.post(`/api/v1/sandboxes/${sandboxA}/ports`).set({ Authorization: `Bearer ${key.key}` }).send({ port: 8080 });
    expect(published.status, JSON.stringify(published.body)).toBe(201);
    const token = published.body.token as string;
    expect(await portStatus(sandboxA, 8080, token)).not.toBe(401);
    expect(await portStatus(sandboxA, 8080, 'nbxp_wrong')).toBe(401);

    const signer = await makeKey(t, KEY_PRESETS.sandbox);
    const signedRes = await fetch(`${t.url}/daytona/api/sandbox/${sandboxA}/ports/8080/signed-preview-url?expiresInSeconds=60`, { headers: { Authorization: `Bearer ${signer.key}` } });
    const signed = (await signedRes.json()) as { token: string };
    expect(signedRes.status).toBe(200);
    expect(await portStatus(sandboxA, 8080, signed.token)).not.toBe(401);
    const tooLong = await fetch(`${t.url}/daytona/api/sandbox/${sandboxA}/ports/8080/signed-preview-url?expiresInSeconds=${SIGNED_URL_MAX + 1}`, { headers: { Authorization: `Bearer ${signer.key}` } });
    expect(tooLong.status).toBe(400);

    await revoke(key);
    await revoke(signer);
    // The proxy caches port records and key states for a second.
    await waitFor('revoked port token refused', async () => (await portStatus(sandboxA, 8080, token)) === 401, 15_000);
    await waitFor('revoked signed preview token refused', async () => (await portStatus(sandboxA, 8080, signed.token)) === 401, 15_000);
  });
});

describe('a key limited to one sandbox', () => {
  it("sees only that sandbox's snapshots, in every API", async () => {
    for (const [id, name] of [[sandboxA, 'scope-snap-a'], [sandboxB, 'scope-snap-b']]) {
      const res = await t.http.post('/api/v1/snapshots').set(t.auth).send({ sandboxId: id, name });
      expect(res.status, JSON.stringify(res.body)).toBeLessThan(300);
    }
    const limited = await makeKey(t, KEY_PRESETS.sandbox, [sandboxA]);
    const bearer = { Authorization: `Bearer ${limited.key}` };
    const native = await t.http.get('/api/v1/snapshots').set(bearer);
    expect(native.status).toBe(200);
    expect(native.body.items.map((s: { name: string }) => s.name)).toEqual(['scope-snap-a']);
    expect((await t.http.get('/api/v1/snapshots/scope-snap-b').set(bearer)).status).toBe(404);
    expect((await t.http.get('/api/v1/snapshots/scope-snap-a').set(bearer)).status).toBe(200);
    const e2b = (await (await fetch(`${t.url}/e2b/snapshots`, { headers: { 'X-API-KEY': limited.key } })).json()) as { snapshotID: string }[];
    expect(e2b.map((s) => s.snapshotID)).toEqual(['scope-snap-a']);
    const daytona = (await (await fetch(`${t.url}/daytona/api/snapshots`, { headers: bearer })).json()) as { items: { name: string }[] };
    expect(daytona.items.map((s) => s.name)).toEqual(['scope-snap-a']);
    expect((await fetch(`${t.url}/daytona/api/snapshots/scope-snap-b`, { headers: bearer })).status).toBe(404);
    // The unlimited key still sees both.
    const all = await t.http.get('/api/v1/snapshots').set(t.auth);
    expect(all.body.items.map((s: { name: string }) => s.name).sort()).toEqual(['scope-snap-a', 'scope-snap-b']);
  });
});

describe('a deleted sandbox', () => {
  it('ends every token and signed URL that was obtained for it', async () => {
    const token = await envdToken(t.apiKey, sandboxB);
    const sig = fileSignature('/etc/hostname', 'read', '', token, String(now() + 120));
    const e2bUrl = `${t.url}/files?path=%2Fetc%2Fhostname&signature=${encodeURIComponent(sig)}&signature_expiration=${now() + 120}`;
    expect((await fetch(e2bUrl)).status).toBe(200);
    const { key } = await signingKey(t.apiKey, sandboxB);
    const daytonaUrl = daytonaSigned(sandboxB, 'download', key, '/etc/hostname', now() + 120);
    expect((await fetch(daytonaUrl)).status).toBe(200);
    const published = await t.http.post(`/api/v1/sandboxes/${sandboxB}/ports`).set(t.auth).send({ port: 8081 });
    expect(await portStatus(sandboxB, 8081, published.body.token)).not.toBe(401);

    expect((await t.http.delete(`/api/v1/snapshots/scope-snap-b`).set(t.auth)).status).toBeLessThan(300);
    expect((await t.http.delete(`/api/v1/sandboxes/${sandboxB}`).set(t.auth)).status).toBe(204);
    // E2B reports a gone sandbox as 502 (the SDK: "not running"), never as a working token.
    expect((await envdFetch(sandboxB, '/health', { token })).status).toBe(502);
    expect((await envdFetch(sandboxB, '/files?path=/etc/hostname', { token })).status).toBe(502);
    expect((await fetch(e2bUrl)).status).toBe(401);
    expect((await fetch(daytonaUrl)).status).toBe(403);
    expect(await portStatus(sandboxB, 8081, published.body.token)).toBe(404);
    // And no new credential can be had for it.
    expect((await e2bDetail(t.apiKey, sandboxB)).status).toBe(404);
    expect((await signingKey(t.apiKey, sandboxB)).status).toBe(404);
  });
});

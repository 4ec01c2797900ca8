// Regression examples for issue 11 finding 9 (and what the fuzz suite found next to it): bad
// input is a 4xx in the API's own error shape, and no error body shows SQL, a stack or a path
// of this host. Each case was a 500 (or an HTML stack page) before.
import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { publicError, toNestboxError, NestboxError } from '../core/errors.js';
import { silentLogger } from '../core/logger.js';
import { createLogger } from '../src/logger.js';
import { startTestServer, type TestServer } from './harness.js';

let t: TestServer;
beforeAll(async () => {
  t = await startTestServer();
});
afterAll(async () => {
  await t?.close();
});

/** Raw request: the path goes on the wire exactly as written. */
function raw(method: string, path: string, headers: Record<string, string>, body?: Buffer | string): Promise<{ status: number; text: string; json: any }> {
  const u = new URL(t.url);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, method, path, headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        let json: unknown;
        try {
          json = JSON.parse(text);
        } catch {
          json = undefined;
        }
        resolve({ status: res.statusCode!, text, json });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

const bearer = () => ({ authorization: `Bearer ${t.apiKey}` });
const e2bKey = () => ({ 'x-api-key': t.apiKey });
const noInternals = (text: string) => {
  expect(text).not.toMatch(/select .* from|insert into|invalid byte sequence|\$\d/i);
  expect(text).not.toMatch(/\n\s+at |node_modules|\/work\//);
  expect(text).not.toContain(t.dataDir);
};

describe('bad percent-encoding in a path', () => {
  it('native: 400 validation_failed naming the path (was 500 "URI malformed")', async () => {
    const r = await raw('GET', '/api/v1/sandboxes/%ED%A0%80', bearer());
    expect(r.status).toBe(400);
    expect(r.json.error).toMatchObject({ code: 'validation_failed', message: expect.stringContaining('path') });
  });
  it('Daytona: 400 in its shape (was express\'s HTML page with the stack and host paths)', async () => {
    const r = await raw('GET', '/daytona/api/sandbox/%ED%A0%80', bearer());
    expect(r.status).toBe(400);
    expect(r.json).toMatchObject({ statusCode: 400, error: 'Bad Request', path: '/daytona/api/sandbox/%ED%A0%80' });
    noInternals(r.text);
  });
  it('E2B: 400 {code, message}', async () => {
    const r = await raw('GET', '/e2b/sandboxes/%ED%A0%80', e2bKey());
    expect(r.status).toBe(400);
    expect(r.json).toMatchObject({ code: 400, message: expect.stringContaining('percent-encoded') });
  });
  it('a bad escape in a query value is a 400 naming the parameter', async () => {
    const r = await raw('GET', '/api/v1/sandboxes?cursor=%E2%82', bearer());
    expect(r.status).toBe(400);
    expect(r.json.error.message).toContain('cursor');
  });
});

describe('NUL bytes in ids and strings (PostgreSQL rejects \\0 in text; the SQL was in the body)', () => {
  it('Daytona control plane and toolbox: 400, no SQL', async () => {
    for (const path of ['/daytona/api/sandbox/ab%00cd', '/daytona/toolbox/ab%00cd/files?path=/']) {
      const r = await raw('GET', path, bearer());
      expect(r.status, path).toBe(400);
      expect(r.json.message).toContain('NUL');
      noInternals(r.text);
    }
  });
  it('E2B: 400, no SQL', async () => {
    const r = await raw('GET', '/e2b/sandboxes/ab%00cd', e2bKey());
    expect(r.status).toBe(400);
    expect(r.json).toMatchObject({ code: 400 });
    noInternals(r.text);
  });
  it('a NUL in a query value is a 400 naming the parameter', async () => {
    const r = await raw('GET', '/daytona/api/sandbox?labels=a%00b', bearer());
    expect(r.status).toBe(400);
    expect(r.json.message).toBe('labels: must not contain NUL bytes');
  });
  it('a NUL in a JSON string of a body is a 400 naming the field, on each API', async () => {
    const json = { 'content-type': 'application/json' };
    const native = await raw('POST', '/api/v1/sandboxes', { ...bearer(), ...json }, '{"labels":{"a":"\\u0000"}}');
    expect(native.status).toBe(400);
    expect(native.json.error.message).toBe('body.labels.a: must not contain NUL bytes');
    const daytona = await raw('POST', '/daytona/api/sandbox', { ...bearer(), ...json }, '{"labels":{"a":"x\\u0000"}}');
    expect(daytona.status).toBe(400);
    expect(daytona.json.message).toBe('body.labels.a: must not contain NUL bytes');
    const e2b = await raw('POST', '/e2b/sandboxes', { ...e2bKey(), ...json }, '{"templateID":"a\\u0000b"}');
    expect(e2b.status).toBe(400);
    expect(e2b.json).toEqual({ code: 400, message: 'body.templateID: must not contain NUL bytes' });
  });
});

describe('Content-Type: application/json; charset=latin1', () => {
  it('is 415 in each API\'s shape (was 500 "unsupported charset")', async () => {
    const ct = { 'content-type': 'application/json; charset=latin1' };
    const native = await raw('POST', '/api/v1/sandboxes', { ...bearer(), ...ct }, '{}');
    expect(native.status).toBe(415);
    expect(native.json.error.code).toBe('unsupported_media_type');
    const daytona = await raw('POST', '/daytona/api/sandbox', { ...bearer(), ...ct }, '{}');
    expect(daytona.status).toBe(415);
    expect(daytona.json).toMatchObject({ statusCode: 415, code: 'unsupported_media_type' });
    const e2b = await raw('POST', '/e2b/sandboxes', { ...e2bKey(), ...ct }, '{}');
    expect(e2b.status).toBe(415);
    expect(e2b.json).toMatchObject({ code: 415 });
  });
});

describe('malformed protobuf on envd Connect routes', () => {
  it('is 400 invalid_argument in Connect\'s shape (connect-es answered 500 internal "parse binary")', async () => {
    const headers = { 'content-type': 'application/proto', 'connect-protocol-version': '1', 'x-access-token': 'nope', 'e2b-sandbox-id': 'abc' };
    for (const path of ['/process.Process/List', '/filesystem.Filesystem/Stat', '/process.Process/SendSignal']) {
      const r = await raw('POST', path, headers, Buffer.from([0xff, 0xff, 0xff]));
      expect(r.status, path).toBe(400);
      expect(r.json, path).toMatchObject({ code: 'invalid_argument', message: expect.stringContaining('protobuf') });
    }
  });
  it('a valid protobuf body still reaches the RPC (here: its auth check)', async () => {
    const r = await raw('POST', '/process.Process/List', { 'content-type': 'application/proto', 'connect-protocol-version': '1', 'x-access-token': 'nope', 'e2b-sandbox-id': 'abc' }, Buffer.alloc(0));
    expect(r.status).toBe(401);
    expect(r.json).toMatchObject({ code: 'unauthenticated' });
  });
  it('gzip-compressed garbage is 400 too', async () => {
    const { gzipSync } = await import('node:zlib');
    const r = await raw('POST', '/filesystem.Filesystem/Stat', { 'content-type': 'application/proto', 'content-encoding': 'gzip', 'connect-protocol-version': '1', 'e2b-sandbox-id': 'abc' }, gzipSync(Buffer.from([0x0a, 0x09, 0x01])));
    expect(r.status).toBe(400);
    expect(r.json.code).toBe('invalid_argument');
  });
  it('a body that is not the brotli or gzip it claims is 400, JSON or protobuf (found by the fuzz suite: brotli was 500 "decompression failed")', async () => {
    for (const contentType of ['application/json', 'application/proto']) {
      for (const encoding of ['br', 'gzip']) {
        const r = await raw('POST', '/filesystem.Filesystem/RemoveWatcher', { 'content-type': contentType, 'content-encoding': encoding, 'connect-protocol-version': '1', 'x-access-token': 'nope', 'e2b-sandbox-id': 'abc' }, '[]');
        expect(r.status, `${contentType} ${encoding}`).toBe(400);
        expect(r.json, `${contentType} ${encoding}`).toMatchObject({ code: 'invalid_argument', message: expect.stringContaining(encoding === 'br' ? 'br' : '') });
      }
    }
  });
});

describe('the last-resort guard', () => {
  it('an unknown error is a 500 with a reference, its text only in the log', () => {
    const logged: string[] = [];
    const log = createLogger({ level: 'error' }, { write: (line: string) => logged.push(line) });
    const e = publicError(new Error('select * from "sandboxes" where id = $1 - boom at /work/x/node_modules/pg/lib/client.js:1:1'), log, 'test');
    expect(e.status).toBe(500);
    expect(e.message).toMatch(/^internal error; the server log has the details \(reference [a-z0-9-]+\)$/);
    expect(e.message).not.toContain('select');
    expect(logged.join('\n')).toContain('select * from');
    expect(logged.join('\n')).toContain(String(e.details?.reference));
  });
  it('an explicit internal NestboxError (which may quote a host path) is not shown either', () => {
    const e = publicError(new NestboxError('internal', 'host agent answered 500: ENOENT /var/lib/nestbox/x'), silentLogger);
    expect(e.message).not.toContain('/var/lib');
  });
  it('4xx and meaningful 5xx keep their message', () => {
    expect(publicError(new NestboxError('not_supported', 'volumes are not supported')).message).toBe('volumes are not supported');
    expect(publicError(new NestboxError('not_found', 'sandbox x not found')).status).toBe(404);
  });
  it('PostgreSQL data exceptions and URIErrors are client errors', () => {
    expect(toNestboxError(Object.assign(new Error('select 1 - invalid byte sequence for encoding "UTF8": 0x00'), { code: '22021' }))).toMatchObject({ status: 400, message: expect.not.stringContaining('select') });
    expect(toNestboxError(Object.assign(new Error('x'), { code: '22003' })).status).toBe(400);
    expect(toNestboxError(Object.assign(new Error('x'), { code: '23505' })).status).toBe(500);
    expect(toNestboxError(new URIError('URI malformed')).status).toBe(400);
  });
  it('a route error passed to next(err) is answered in the API\'s shape, never express\'s HTML', async () => {
    // Express decodes route parameters itself and hands the failure on with next(err).
    const r = await raw('GET', '/daytona/toolbox/abc/process/session/%E0%A4%A', bearer());
    expect(r.status).toBeLessThan(500);
    expect(r.text).not.toContain('<!DOCTYPE');
    expect(r.json).toMatchObject({ statusCode: r.status });
  });
});

describe('huge command timeouts (found by the fuzz suite)', () => {
  let id: string;
  let envdToken: string;
  beforeAll(async () => {
    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ timeoutSeconds: 0, memoryMiB: 512, egress: { mode: 'deny-all' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    id = created.body.id;
    envdToken = (await t.http.get(`/e2b/sandboxes/${id}`).set('X-API-Key', t.apiKey)).body.envdAccessToken;
  }, 120_000);

  it('native: an id of "." or ".." names nothing: 404 (the typed guest client found the session list there and answered 500; found by the fuzz suite)', async () => {
    for (const path of [`sessions/.`, `sessions/..`, `sessions/%2E`, `sessions/s1/commands/.`, `commands/..`]) {
      const r = await raw('GET', `/api/v1/sandboxes/${id}/${path}`, bearer());
      expect(r.status, `${path}: ${r.text}`).toBe(404);
      expect(r.json.error.code, path).toBe('not_found');
    }
  });

  it('Daytona: a timeout past 24 h is a 400 naming it (it ended the command at once with a 504)', async () => {
    const r = await raw('POST', `/daytona/toolbox/${id}/process/execute`, { ...bearer(), 'content-type': 'application/json' }, JSON.stringify({ command: 'exit 3', timeout: 1e9 }));
    expect(r.status).toBe(400);
    expect(r.json.message).toContain('timeout');
    const ok = await raw('POST', `/daytona/toolbox/${id}/process/execute`, { ...bearer(), 'content-type': 'application/json' }, JSON.stringify({ command: 'sleep 0.2; exit 3', timeout: 86_400 }));
    expect(ok.status, ok.text).toBe(200);
    expect(ok.json.exitCode).toBe(3);
  });

  it('E2B: a Connect deadline past 2^31 ms does not kill the process at once', async () => {
    const message = Buffer.from(JSON.stringify({ process: { cmd: '/bin/sh', args: ['-c', 'sleep 0.3; echo done'] } }));
    const head = Buffer.alloc(5);
    head.writeUInt32BE(message.length, 1);
    const r = await raw('POST', '/process.Process/Start', {
      'content-type': 'application/connect+json', 'connect-protocol-version': '1', 'connect-timeout-ms': '9999999999', 'e2b-sandbox-id': id, 'x-access-token': envdToken,
    }, Buffer.concat([head, message]));
    expect(r.status).toBe(200);
    // Envelopes of JSON: start, data "done", end with exit code 0 (before the fix: end "signal: killed").
    expect(r.text).toContain(Buffer.from('done\n').toString('base64'));
    expect(r.text).toMatch(/"exitCode":0|"exited":true/);
    expect(r.text).not.toContain('killed');
  });
});

describe('envd upload with a body that is not the gzip it claims (found by the fuzz suite)', () => {
  it('is a 400 naming the body (was 502 "host local is not reachable: socket hang up")', async () => {
    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ timeoutSeconds: 0, memoryMiB: 512, egress: { mode: 'deny-all' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const token = (await t.http.get(`/e2b/sandboxes/${created.body.id}`).set('X-API-Key', t.apiKey)).body.envdAccessToken;
    const headers = { 'e2b-sandbox-id': created.body.id, 'x-access-token': token, 'content-encoding': 'gzip' };
    for (const contentType of ['application/octet-stream', 'multipart/form-data; boundary=zz']) {
      const r = await raw('POST', '/files?path=%2Ftmp%2Fx', { ...headers, 'content-type': contentType, 'content-length': '9' }, 'not gzip!');
      expect(r.status, `${contentType}: ${r.text}`).toBe(400);
      expect(r.json).toMatchObject({ code: 400, message: expect.stringContaining('gzip') });
    }
  }, 120_000);
});

describe('envd upload of a form that breaks while it is translated (found by the fuzz suite)', () => {
  it('is a 400 in E2B\'s shape naming the form, never 502 "socket hang up"', async () => {
    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ timeoutSeconds: 0, memoryMiB: 512, egress: { mode: 'deny-all' } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    const token = (await t.http.get(`/e2b/sandboxes/${created.body.id}`).set('X-API-Key', t.apiKey)).body.envdAccessToken;
    const headers = { 'e2b-sandbox-id': created.body.id, 'e2b-sandbox-port': '49983', 'x-access-token': token, 'content-type': 'multipart/form-data; boundary=fuzzb' };
    const form = (filename: string, data: string) => `--fuzzb\r\nContent-Disposition: form-data; name="file"; filename="${filename}"\r\nContent-Type: application/octet-stream\r\n\r\n${data}\r\n--fuzzb--\r\n`;
    const cases = [
      ['/files?path=%2Ftmp%2Ffuzz%2Fx%2F%10%F4%89%A1%86%05&signature_expiration=x', form('/tmp/fuzz/a\u0000b', 'xyz')],
      ['/files?path=%2Ftmp%2Ffuzz%2Fup&username=&signature=%5B%5D&signature_expiration=99999999999', form('/tmp/fuzz/\u0002b', '\u0006')],
    ];
    for (const [path, body] of cases) {
      const r = await raw('POST', path, headers, body);
      // A control character in a part's filename: busboy refuses the part header.
      expect(r.status, `${path}: ${r.text}`).toBe(400);
      expect(r.json, r.text).toMatchObject({ code: 400, message: expect.stringContaining('multipart/form-data') });
    }
    // `username` picks the account the write is for (envd's): one the sandbox lacks is a 400 naming it.
    const unknown = await raw('POST', '/files?path=%2Ftmp%2Ffuzz%2Fup&username=%09', headers, form('/tmp/fuzz/ok', 'x'));
    expect(unknown.status, unknown.text).toBe(400);
    expect(unknown.json, unknown.text).toMatchObject({ code: 400, message: expect.stringMatching(/^user: no such user/) });
  }, 120_000);
});

// A 1 GiB file through every hop (client → server → host agent → guest agent → disk and back),
// raw and multipart, with every process's peak memory measured: nothing may hold the file.
import { createHash, randomBytes } from 'node:crypto';
import http from 'node:http';
import { readdirSync, readFileSync } from 'node:fs';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './harness.js';

const GiB = 1024 ** 3;
const BLOCK = 1024 * 1024;
let t: TestServer;
let id: string;

beforeAll(async () => {
  t = await startTestServer();
  const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ timeoutSeconds: 0, memoryMiB: 512 });
  expect(created.status).toBe(201);
  id = created.body.id;
});
afterAll(async () => {
  await t?.close();
});

/** 1 GiB of distinct blocks, generated while sent, hashed on the way. */
function gibibyteSource(): { stream: Readable; sha: () => string } {
  const seed = randomBytes(BLOCK);
  const hash = createHash('sha256');
  let block = 0;
  const stream = new Readable({
    read() {
      if (block === GiB / BLOCK) return this.push(null);
      const chunk = Buffer.from(seed);
      chunk.writeUInt32BE(block++, 0);
      hash.update(chunk);
      this.push(chunk);
    },
  });
  return { stream, sha: () => hash.digest('hex') };
}

function peakRss(pid: number): number {
  const line = readFileSync(`/proc/${pid}/status`, 'utf8').split('\n').find((l) => l.startsWith('VmHWM:'))!;
  return Number(line.replace(/\D+/g, '')) * 1024;
}

function processesWhere(test: (cmdline: string, cgroup: string, ppid: number) => boolean): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8').replace(/\0/g, ' ');
      const cgroup = readFileSync(`/proc/${entry}/cgroup`, 'utf8');
      const stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (test(cmdline, cgroup, ppid)) found.push(Number(entry));
    } catch {
      // gone
    }
  }
  return found;
}

function send(method: string, path: string, headers: Record<string, string>, body: Readable): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(new URL(`${t.url}${path}`), { method, headers: { ...t.auth, ...headers } }, (res) => {
      let text = '';
      res.on('data', (c) => (text += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
    });
    req.on('error', reject);
    body.pipe(req);
  });
}

function downloadSha(path: string, init: { method?: string; body?: string; headers?: Record<string, string> } = {}): Promise<{ sha: string; bytes: number; contentType: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(new URL(`${t.url}${path}`), { method: init.method ?? 'GET', headers: { ...t.auth, ...init.headers } }, (res) => {
      if (res.statusCode !== 200) return reject(new Error(`download answered ${res.statusCode}`));
      const hash = createHash('sha256');
      let bytes = 0;
      res.on('data', (c: Buffer) => {
        hash.update(c);
        bytes += c.length;
      });
      res.on('end', () => resolve({ sha: hash.digest('hex'), bytes, contentType: String(res.headers['content-type']) }));
    });
    req.on('error', reject);
    req.end(init.body);
  });
}

describe('1 GiB through the API', () => {
  it('round-trips raw and multipart with bounded memory in the server, host agent and guest agent', { timeout: 300_000 }, async () => {
    const hostAgent = processesWhere((cmd, _cg, ppid) => ppid === process.pid && cmd.includes('host-agent'))[0];
    const guestAgent = processesWhere((cmd, cgroup) => cmd.includes('guest-agent.mjs') && cgroup.includes(id))[0];
    expect(hostAgent).toBeDefined();
    expect(guestAgent).toBeDefined();
    const before = { server: peakRss(process.pid), host: peakRss(hostAgent), guest: peakRss(guestAgent) };

    const raw = gibibyteSource();
    const put = await send('PUT', `/api/v1/sandboxes/${id}/files?path=/big/raw.bin`, { 'content-type': 'application/octet-stream' }, raw.stream);
    expect(put.status, put.text).toBe(200);
    expect(JSON.parse(put.text).size).toBe(GiB);
    const rawDown = await downloadSha(`/api/v1/sandboxes/${id}/files?path=/big/raw.bin`);
    expect(rawDown).toMatchObject({ sha: raw.sha(), bytes: GiB });

    // Multipart: the same generator wrapped in one form part, sent chunked.
    const boundary = `nbx${randomBytes(8).toString('hex')}`;
    const multi = gibibyteSource();
    const head = Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="files[0].path"\r\n\r\n/big/multi.bin\r\n--${boundary}\r\nContent-Disposition: form-data; name="files[0].file"; filename="multi.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`);
    const tail = Buffer.from(`\r\n--${boundary}--\r\n`);
    const form = Readable.from((async function* () {
      yield head;
      for await (const chunk of multi.stream) yield chunk as Buffer;
      yield tail;
    })());
    const up = await send('POST', `/api/v1/sandboxes/${id}/files/upload`, { 'content-type': `multipart/form-data; boundary=${boundary}` }, form);
    expect(up.status, up.text).toBe(200);
    const bulk = await downloadSha(`/api/v1/sandboxes/${id}/files/download`, { method: 'POST', body: JSON.stringify({ paths: ['/big/multi.bin'] }), headers: { 'content-type': 'application/json' } });
    expect(bulk.contentType).toMatch(/^multipart\/form-data/);
    expect(bulk.bytes).toBeGreaterThan(GiB);
    const inside = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd: 'sha256sum /big/multi.bin | cut -d" " -f1' });
    expect(inside.body.stdout.trim()).toBe(multi.sha());

    const growth = { server: peakRss(process.pid) - before.server, host: peakRss(hostAgent) - before.host, guest: peakRss(guestAgent) - before.guest };
    console.log(`peak RSS growth over 4 GiB moved: server ${(growth.server / 2 ** 20).toFixed(1)} MiB, host agent ${(growth.host / 2 ** 20).toFixed(1)} MiB, guest agent ${(growth.guest / 2 ** 20).toFixed(1)} MiB`);
    for (const [who, bytes] of Object.entries(growth)) expect(bytes, who).toBeLessThan(128 * 1024 * 1024);
    await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd: 'rm -rf /big' });
  });
});

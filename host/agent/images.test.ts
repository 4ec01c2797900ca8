// The host agent's image routes (POST /v1/images/pull, GET /v1/images, DELETE /v1/images/{id})
// through HttpHostClient, over a real local driver whose OCI store pulls from Debian's registry
// on loopback: progress as it happens, a second pull answered from the store, the statuses of
// a bad reference, a missing tag and refused credentials (which appear in no log line, argv or
// message), a cancelled pull leaving nothing, and deletes refused while a sandbox or a snapshot
// on the host still uses the image.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NestboxError } from '../../core/errors.js';
import type { Logger, LogFields } from '../../core/logger.js';
import { Cgroups } from '../drivers/local/cgroups.js';
import { LocalDriver } from '../drivers/local/driver.js';
import { uniqueId } from '../drivers/local/test-support.js';
import { buildTestImage, busyboxImageSpec, pushTestImage, startTestRegistry, type TestRegistry } from '../images/oci/test-registry.js';
import { HttpHostClient } from '../protocol/client.js';
import { HostImage, HostPullLine } from '../protocol/schemas.js';
import { HostAgentServer } from './server.js';

const IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
const REPO = resolve(import.meta.dirname, '../..');
const AGENT_BUNDLE = join(REPO, 'dist', 'guest-agent.mjs');
const SECRET = 'a-host-secret-of-enough-length';
const CREDS = { username: 'puller', password: `pw-${randomBytes(12).toString('hex')}` };

/** Every line the host agent logs, fields and message as one string. */
function recordingLogger(lines: string[]): Logger {
  const write = (a: LogFields | string, b?: string) => lines.push(typeof a === 'string' ? a : `${JSON.stringify(a)} ${b}`);
  const logger: Logger = { debug: write, info: write, warn: write, error: write, child: () => logger };
  return logger;
}

/** Samples the argv of every skopeo running while `task` runs. */
async function watchingSkopeoArgv<T>(task: () => Promise<T>): Promise<{ result: T | unknown; argv: string[] }> {
  const argv: string[] = [];
  const watcher = setInterval(() => {
    for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
      try {
        const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
        if (cmdline.includes('skopeo')) argv.push(cmdline);
      } catch {
        // Gone.
      }
    }
  }, 5);
  try {
    return { result: await task().catch((error: unknown) => error), argv };
  } finally {
    clearInterval(watcher);
  }
}

describe.skipIf(process.getuid?.() !== 0)('host agent image routes', () => {
  const dataDir = mkdtempSync('/tmp/nbxi-');
  const storeDir = join(dataDir, 'oci');
  const ownerId = uniqueId('img');
  const logLines: string[] = [];
  let registry: TestRegistry;
  let authRegistry: TestRegistry;
  let driver: LocalDriver;
  let cgroups: Cgroups;
  let server: HostAgentServer;
  let client: HttpHostClient;
  let base: string;

  beforeAll(async () => {
    if (!existsSync(AGENT_BUNDLE)) execFileSync('npm', ['run', 'build'], { cwd: REPO, stdio: 'inherit' });
    cgroups = await Cgroups.detect();
    [registry, authRegistry] = await Promise.all([startTestRegistry(), startTestRegistry({ htpasswd: CREDS })]);
    const busybox = await buildTestImage(join(dataDir, 'build', 'busybox'), busyboxImageSpec());
    await pushTestImage(busybox, `${registry.host}/test/busybox:1`);
    await pushTestImage(busybox, `${authRegistry.host}/private/busybox:1`, CREDS);
    // A big layer of random bytes: its copy takes long enough to be cancelled in the middle.
    const blob = join(dataDir, 'random.bin');
    writeFileSync(blob, randomBytes(96 * 1024 * 1024));
    await pushTestImage(await buildTestImage(join(dataDir, 'build', 'big'), busyboxImageSpec({ files: { 'big.bin': { copyFrom: blob } } })), `${registry.host}/test/big:1`);
    rmSync(blob);
    driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, ociStoreDir: storeDir, guestAgentBundle: AGENT_BUNDLE, ownerId, slotPoolSize: 0 });
    await driver.init();
    server = new HostAgentServer({ hostId: 'h1', secret: SECRET, driver, logger: recordingLogger(logLines) });
    const port = await server.listen(0, '127.0.0.1');
    base = `http://127.0.0.1:${port}`;
    client = new HttpHostClient({ hostId: 'h1', baseUrl: base, secret: SECRET });
  }, 300_000);

  afterAll(async () => {
    for (const runtime of (await driver?.list()) ?? []) await driver.destroy(runtime.id).catch(() => {});
    await server?.close();
    await driver?.close();
    await cgroups?.remove(cgroups.groupFor(`nestbox/${ownerId}`)).catch(() => {});
    await Promise.all([registry?.stop(), authRegistry?.stop()]);
    rmSync(dataDir, { recursive: true, force: true });
  }, 120_000);

  const pullRaw = (body: unknown) => fetch(`${base}/v1/images/pull`, { method: 'POST', headers: { authorization: `Bearer ${SECRET}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });

  it('pulls with progress as NDJSON lines, answers the second pull from the store, and lists the image', async () => {
    const progress: string[] = [];
    const image = await client.pullImage(`${registry.host}/test/busybox:1`, { onProgress: (line) => progress.push(line) });
    expect(HostImage.parse(image)).toEqual(image);
    expect(image).toMatchObject({ id: expect.stringMatching(/^sha256:[a-f0-9]{64}$/), reference: `${registry.host}/test/busybox:1` });
    expect(image.sizeBytes).toBeGreaterThan(100_000);
    expect(progress.join("\n")).toMatch(/copying sha256:.*\n.*layers from the layer cache\n.*unpacking\n.*ready in/);

    // The wire: NDJSON, every line one of HostPullLine's, the image last.
    const raw = await pullRaw({ reference: `${registry.host}/test/busybox:1` });
    expect(raw.status).toBe(200);
    expect(raw.headers.get('content-type')).toBe('application/x-ndjson');
    const lines = (await raw.text()).split('\n');
    expect(lines.pop()).toBe('');
    const parsed = lines.map((line) => HostPullLine.parse(JSON.parse(line)));
    expect(parsed.at(-1)).toEqual({ image: { ...image, pulledAt: image.pulledAt } });
    expect(parsed.slice(0, -1).map((line) => ('progress' in line ? line.progress : ''))).toEqual([`${registry.host}/test/busybox:1: ${image.id} is already in the store`]);

    const again: string[] = [];
    expect((await client.pullImage(`${registry.host}/test/busybox:1`, { onProgress: (line) => again.push(line) })).id).toBe(image.id);
    expect(again).toEqual([expect.stringContaining('already in the store')]);
    expect(readdirSync(join(storeDir, 'images'))).toEqual([image.id.slice('sha256:'.length)]);
    expect((await client.listImages()).map((listed) => listed.id)).toEqual([image.id]);
  });

  it('answers a bad reference 400, a missing tag 404 and a bad body 400, with the catalogue shape', async () => {
    const bad = await client.pullImage('Not A Reference!').catch((error: unknown) => error);
    expect(bad).toBeInstanceOf(NestboxError);
    expect((bad as NestboxError).code).toBe('validation_failed');
    const badRaw = await pullRaw({ reference: 'Not A Reference!' });
    expect(badRaw.status).toBe(400);
    expect((await badRaw.json()).error.code).toBe('validation_failed');

    const missing = await client.pullImage(`${registry.host}/test/busybox:no-such-tag`).catch((error: unknown) => error);
    expect((missing as NestboxError).code).toBe('not_found');
    const missingRaw = await pullRaw({ reference: `${registry.host}/test/busybox:no-such-tag` });
    expect(missingRaw.status).toBe(404);
    expect((await missingRaw.json()).error).toMatchObject({ code: 'not_found', message: expect.stringContaining('no-such-tag') });

    for (const body of [{}, { reference: 'x', credentials: { username: 'u' } }, { reference: 'x', extra: 1 }]) {
      const answer = await pullRaw(body);
      expect(answer.status, JSON.stringify(body)).toBe(400);
      expect((await answer.json()).error.code).toBe('validation_failed');
    }
    const badId = await client.deleteImage('busybox:1').catch((error: unknown) => error);
    expect((badId as NestboxError).code).toBe('validation_failed');
    expect((badId as NestboxError).message).toMatch(/^image id: /);
  });

  it('keeps a slow answer alive with keepalive lines, and reports a failure after the 200 as an error line', async () => {
    // A second host agent on the same driver whose answers start at once (keepalive every 1 ms).
    const eager = new HostAgentServer({ hostId: 'h2', secret: SECRET, driver, logger: recordingLogger([]), pullKeepaliveMs: 1 });
    const port = await eager.listen(0, '127.0.0.1');
    try {
      const eagerClient = new HttpHostClient({ hostId: 'h2', baseUrl: `http://127.0.0.1:${port}`, secret: SECRET });
      const raw = await fetch(`http://127.0.0.1:${port}/v1/images/pull`, {
        method: 'POST',
        headers: { authorization: `Bearer ${SECRET}` },
        body: JSON.stringify({ reference: `${registry.host}/test/busybox:no-such-tag` }),
      });
      expect(raw.status).toBe(200);
      const lines = (await raw.text()).trim().split('\n').map((line) => HostPullLine.parse(JSON.parse(line)));
      expect(lines).toContainEqual({ keepalive: true });
      expect(lines.at(-1)).toMatchObject({ error: { code: 'not_found', message: expect.stringContaining('no-such-tag') } });
      // The client reads through keepalives and turns the error line into the catalogue's error.
      const missing = await eagerClient.pullImage(`${registry.host}/test/busybox:no-such-tag`).catch((error: unknown) => error);
      expect(missing).toBeInstanceOf(NestboxError);
      expect((missing as NestboxError).code).toBe('not_found');
      const progress: string[] = [];
      const image = await eagerClient.pullImage(`${registry.host}/test/busybox:1`, { onProgress: (line) => progress.push(line) });
      expect(image.id).toMatch(/^sha256:/);
      expect(progress).toEqual([expect.stringContaining('already in the store')]);
    } finally {
      await eager.close();
    }
  });

  it('answers refused credentials 401, and never puts credentials in argv, log lines or messages', async () => {
    const ref = `${authRegistry.host}/private/busybox:1`;
    const wrong = { username: CREDS.username, password: `wrong-${randomBytes(8).toString('hex')}` };
    const anonymous = await client.pullImage(ref).catch((error: unknown) => error);
    expect((anonymous as NestboxError).code).toBe('unauthorized');
    const refused = await watchingSkopeoArgv(() => client.pullImage(ref, { credentials: wrong }));
    expect((refused.result as NestboxError).code).toBe('unauthorized');
    expect((refused.result as NestboxError).message).not.toContain(wrong.password);
    const refusedRaw = await pullRaw({ reference: ref, credentials: wrong });
    expect(refusedRaw.status).toBe(401);
    expect(await refusedRaw.text()).not.toContain(wrong.password);

    const accepted = await watchingSkopeoArgv(() => client.pullImage(ref, { credentials: CREDS }));
    expect(HostImage.safeParse(accepted.result).success).toBe(true);
    expect(accepted.argv.length).toBeGreaterThan(0);
    for (const secret of [wrong.password, CREDS.password]) {
      expect([...refused.argv, ...accepted.argv].join('\n')).not.toContain(secret);
      expect(logLines.join('\n')).not.toContain(secret);
    }
    expect(logLines.join('\n')).toContain(`pull ${ref} (with credentials)`);
  });

  it('cancels a pull when the client aborts, leaving nothing half-pulled', async () => {
    const before = readdirSync(join(storeDir, 'images')).sort();
    const controller = new AbortController();
    const cancelled = await client
      .pullImage(`${registry.host}/test/big:1`, {
        signal: controller.signal,
        // The layer copy has just started.
        onProgress: (line) => {
          if (line.includes('copying')) controller.abort();
        },
      })
      .catch((error: unknown) => error);
    expect(cancelled).toBeInstanceOf(NestboxError);
    expect((cancelled as NestboxError).message).toMatch(/cancelled/);
    // The pull's temp dir goes once its skopeo is killed (bounded wait).
    for (let i = 0; i < 300 && readdirSync(join(storeDir, 'tmp')).length; i++) await new Promise((r) => setTimeout(r, 100));
    expect(readdirSync(join(storeDir, 'tmp'))).toEqual([]);
    expect(readdirSync(join(storeDir, 'images')).sort()).toEqual(before);
    expect(logLines.join('\n')).toContain('cancelled by the client');
    // Nothing stuck: the same image pulls completely afterwards, and is deleted again.
    const big = await client.pullImage(`${registry.host}/test/big:1`);
    expect(readdirSync(join(storeDir, 'images'))).toContain(big.id.slice('sha256:'.length));
    await client.deleteImage(big.id);
    expect(readdirSync(join(storeDir, 'images')).sort()).toEqual(before);
  });

  it('refuses to delete an image while a sandbox (running or stopped) or a snapshot uses it, and deletes it after', async () => {
    const image = await client.pullImage(`${registry.host}/test/busybox:1`);
    const id = uniqueId('img');
    await client.createSandbox({ id, image: image.id, cpu: 1, memoryMiB: 256, env: {}, egress: { mode: 'deny-all' } });
    const inUse = async () => {
      const error = await client.deleteImage(image.id).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(NestboxError);
      expect((error as NestboxError).code).toBe('conflict');
      return (error as NestboxError).message;
    };
    expect(await inUse()).toContain(`sandbox ${id}`);
    await client.stopSandbox(id);
    expect(await inUse()).toContain(`sandbox ${id}`);
    await client.snapshotSandbox(id, `${id}-snap`);
    await client.destroySandbox(id);
    expect(await inUse()).toContain(`snapshot ${id}-snap`);
    await client.deleteSnapshot(`${id}-snap`);
    await client.deleteImage(image.id);
    expect(await client.listImages()).toEqual([]);
    // Idempotent; and a sandbox can no longer be made from it.
    await client.deleteImage(image.id);
    const gone = await client.createSandbox({ id: uniqueId('img'), image: image.id, cpu: 1, memoryMiB: 256, env: {} }).catch((e: unknown) => e);
    expect((gone as NestboxError).code).toBe('not_found');
  });
});

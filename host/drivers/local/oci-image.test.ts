// Sandboxes of the local driver created from pulled OCI images (host/images/oci): a busybox
// image (a shell, no bash), a distroless one (one static binary, no shell), the image's Env and
// WorkingDir reaching processes, and the 400 a cmd gets where there is no shell. Images are built
// here with umoci and served by Debian's registry on loopback.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient, AgentRequestError } from '../../agent-protocol/client.js';
import { OciImageStore } from '../../images/oci/store.js';
import { buildTestImage, busyboxImageSpec, distrolessImageSpec, pushTestImage, startTestRegistry, type TestRegistry } from '../../images/oci/test-registry.js';
import type { SandboxSpec } from '../types.js';
import { Cgroups } from './cgroups.js';
import { LocalDriver } from './driver.js';
import { uniqueId } from './test-support.js';

const IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
const REPO = resolve(import.meta.dirname, '../../..');
const AGENT_BUNDLE = join(REPO, 'dist', 'guest-agent.mjs');

describe.skipIf(process.getuid?.() !== 0)('LocalDriver with OCI images', () => {
  const dataDir = mkdtempSync('/tmp/nbxo-');
  const ownerId = uniqueId('oci');
  const created = new Set<string>();
  let registry: TestRegistry;
  let driver: LocalDriver;
  let cgroups: Cgroups;
  let busyboxId: string;
  let distrolessId: string;

  const spec = (id: string, image: string, env: Record<string, string> = {}): SandboxSpec => ({ id, image, cpu: 1, memoryMiB: 256, env });
  async function exec(socket: string, request: { argv?: string[]; cmd?: string }) {
    const client = new AgentClient(socket);
    try {
      return await client.exec({ ...request, timeoutMs: 20_000 });
    } finally {
      client.close();
    }
  }

  /** One JSON request to the agent: its status and parsed body. */
  async function agentJson(socket: string, method: string, path: string, body?: unknown): Promise<{ status: number; body: unknown }> {
    const client = new AgentClient(socket);
    try {
      const response = await client.request({ method, path, headers: body === undefined ? {} : { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });
      const chunks: Buffer[] = [];
      for await (const chunk of response) chunks.push(chunk as Buffer);
      const text = Buffer.concat(chunks).toString('utf8');
      return { status: response.statusCode ?? 0, body: text ? JSON.parse(text) : undefined };
    } finally {
      client.close();
    }
  }

  beforeAll(async () => {
    if (!existsSync(AGENT_BUNDLE)) execFileSync('npm', ['run', 'build'], { cwd: REPO, stdio: 'inherit' });
    cgroups = await Cgroups.detect();
    registry = await startTestRegistry();
    const work = join(dataDir, 'build');
    await pushTestImage(await buildTestImage(join(work, 'busybox'), busyboxImageSpec({ env: ['GREETING=hello from the image', 'PATH=/bin', 'OVERRIDDEN=image'], workingDir: '/srv/app' })), `${registry.host}/test/busybox:1`);
    await pushTestImage(await buildTestImage(join(work, 'distroless'), distrolessImageSpec()), `${registry.host}/test/distroless:1`);
    // The driver finds pulled images in <imagesDir>/oci by default; a store of this test's own.
    const store = new OciImageStore({ storeDir: join(dataDir, 'oci') });
    busyboxId = (await store.pull(`${registry.host}/test/busybox:1`)).meta.id;
    distrolessId = (await store.pull(`${registry.host}/test/distroless:1`)).meta.id;
    driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, ociStoreDir: join(dataDir, 'oci'), guestAgentBundle: AGENT_BUNDLE, ownerId, slotPoolSize: 0 });
    await driver.init();
  }, 300_000);

  afterAll(async () => {
    for (const id of created) await driver?.destroy(id).catch(() => {});
    await driver?.close();
    await cgroups?.remove(cgroups.groupFor(`nestbox/${ownerId}`)).catch(() => {});
    await registry?.stop();
    rmSync(dataDir, { recursive: true, force: true });
  }, 120_000);

  it('runs a busybox image: its shell for cmd, its Env and WorkingDir for processes, the sandbox env on top', async () => {
    const id = uniqueId('bbox');
    created.add(id);
    const runtime = await driver.create(spec(id, busyboxId, { OVERRIDDEN: 'sandbox' }));
    const socket = runtime.agentSocket!;
    const hi = await exec(socket, { argv: ['busybox', 'sh', '-c', 'echo hi; cat /etc/os-release || true'] });
    expect(hi).toMatchObject({ exitCode: 0, stdout: 'hi\nNAME="Nestbox test busybox"\nID=busybox\n' });
    // No bash in the image: a cmd runs in its /bin/sh.
    const env = await exec(socket, { cmd: 'echo "$GREETING|$PATH|$OVERRIDDEN|$HOME"; pwd' });
    expect(env).toMatchObject({ exitCode: 0, stdout: 'hello from the image|/bin|sandbox|/srv/app\n/srv/app\n' });
    // A session runs in /bin/sh too, and keeps its state between commands.
    const session = await agentJson(socket, 'POST', '/sessions', {});
    expect(session.status).toBe(201);
    const sid = (session.body as { sessionId: string }).sessionId;
    await agentJson(socket, 'POST', `/sessions/${sid}/commands`, { cmd: 'cd /srv && X=kept' });
    const pwd = await agentJson(socket, 'POST', `/sessions/${sid}/commands`, { cmd: 'echo "$(pwd) $X"' });
    expect(pwd.body).toMatchObject({ exitCode: 0, stdout: '/srv kept\n' });
    // Stopped and started again: the same image below the kept disk.
    await exec(socket, { cmd: 'echo kept > /srv/app/note' });
    await driver.stop(id);
    const again = await driver.start(spec(id, busyboxId, { OVERRIDDEN: 'sandbox' }));
    expect(await exec(again.agentSocket!, { argv: ['cat', '/srv/app/note'] })).toMatchObject({ exitCode: 0, stdout: 'kept\n' });
  });

  it('runs a distroless image by argv, and answers a cmd with a 400 saying there is no shell', async () => {
    const id = uniqueId('dless');
    created.add(id);
    const runtime = await driver.create(spec(id, distrolessId));
    const socket = runtime.agentSocket!;
    const version = await exec(socket, { argv: ['/tini', '--version'] });
    expect(version.exitCode).toBe(0);
    expect(version.stdout).toMatch(/^tini version \d+\.\d+\.\d+/);
    const refused = await exec(socket, { cmd: 'echo hi' }).catch((error) => error);
    expect(refused).toBeInstanceOf(AgentRequestError);
    expect(refused.status).toBe(400);
    expect(refused.code).toBe('validation_failed');
    expect(refused.message).toMatch(/cmd: this sandbox's image has no shell.*start the process by argv/);
    // Detached processes: by argv they run; by cmd, and sessions, are the same clear 400.
    const started = await agentJson(socket, 'POST', '/processes', { argv: ['/tini', '--version'] });
    expect(started.status).toBe(201);
    const processId = (started.body as { processId: string }).processId;
    let info: { status?: string; exitCode?: number } = {};
    for (let i = 0; i < 200 && info.status !== 'exited'; i++) {
      info = (await agentJson(socket, 'GET', `/processes/${processId}`)).body as typeof info;
      if (info.status !== 'exited') await new Promise((r) => setTimeout(r, 25));
    }
    expect(info).toMatchObject({ status: 'exited', exitCode: 0 });
    for (const [path, body] of [['/processes', { cmd: 'echo hi' }], ['/sessions', {}]] as const) {
      const answer = await agentJson(socket, 'POST', path, body);
      expect(answer.status, path).toBe(400);
      expect(JSON.stringify(answer.body), path).toContain('start the process by argv');
    }
    // Files work without anything from the image.
    const client = new AgentClient(socket);
    try {
      expect((await client.list('/')).entries.map((entry) => entry.name)).toContain('tini');
    } finally {
      client.close();
    }
  });

  it('opens no device node planted in an image tree: the root overlay is nodev', async () => {
    // The store removes an image's device nodes at unpack; this one is put straight into the
    // unpacked tree, as if a layer still had one.
    const store = new OciImageStore({ storeDir: join(dataDir, 'oci') });
    const rootfs = (await store.get(busyboxId))!.rootfs;
    execFileSync('mknod', ['-m', '666', join(rootfs, 'planted-null'), 'c', '1', '3']);
    const id = uniqueId('nodev');
    created.add(id);
    try {
      const runtime = await driver.create(spec(id, busyboxId));
      const opened = await exec(runtime.agentSocket!, { cmd: 'echo x > /planted-null && echo opened' });
      expect(opened.stdout).toBe('');
      expect(opened.exitCode).not.toBe(0);
      expect(opened.stderr).toMatch(/Permission denied/);
      // The sandbox's own /dev still works.
      expect(await exec(runtime.agentSocket!, { cmd: 'echo x > /dev/null && echo ok' })).toMatchObject({ exitCode: 0, stdout: 'ok\n' });
    } finally {
      await driver.destroy(id);
      created.delete(id);
      rmSync(join(rootfs, 'planted-null'), { force: true });
    }
  });

  it('refuses an image id that is not in the store, and leaves nothing behind', async () => {
    const id = uniqueId('nope');
    const error = await driver.create(spec(id, `sha256:${'0'.repeat(64)}`)).catch((e) => e);
    expect(error.code).toBe('not_found');
    expect(error.message).toContain('not in this host');
    expect(existsSync(join(dataDir, 'sandboxes', id))).toBe(false);
    const invalid = await driver.create(spec(uniqueId('bad'), 'busybox:latest')).catch((e) => e);
    expect(invalid.code).toBe('validation_failed');
  });
});

// Daytona's declarative images (daytona-wave2.md §1): `snapshot.create({name, image})` with its
// build logs and states, `create({image})` built on demand and deduplicated by snapshotRef,
// `Image.fromDockerfile` with COPY of uploaded contexts, failing builds, and the snapshot
// routes (get, list, activate, delete, 409 on a duplicate name) — through the real SDK against
// a real server whose builds run in real build sandboxes. Bases come from a registry on loopback
// (Debian's docker-registry, seeded with an image built here) or are Nestbox's `default`; no
// build or sandbox here reaches outside the host.
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DaytonaConflictError, DaytonaError, DaytonaNotFoundError, Image, type Sandbox } from '@daytonaio/sdk';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startDaytonaEnv, rawFetch, type DaytonaTestEnv } from './helpers.js';
import { buildTestImage, busyboxImageSpec, pushTestImage, startTestRegistry, type TestRegistry } from '../../host/images/oci/test-registry.js';

let env: DaytonaTestEnv;
let registry: TestRegistry;
let work: string;
let busybox: string;
const created: Sandbox[] = [];

beforeAll(async () => {
  work = mkdtempSync('/tmp/nbx-daytona-images-');
  registry = await startTestRegistry();
  busybox = `${registry.host}/test/busybox:1`;
  await pushTestImage(await buildTestImage(join(work, 'busybox'), busyboxImageSpec({ env: ['PATH=/bin'], files: { 'etc/passwd': { content: 'root:x:0:0:root:/root:/bin/sh\n' } } })), busybox);
  env = await startDaytonaEnv();
}, 300_000);

afterAll(async () => {
  for (const s of created) await s.delete().catch(() => undefined);
  await env?.server.close();
  await registry?.stop();
  rmSync(work, { recursive: true, force: true });
});

/** A sandbox from a snapshot, with no network, deleted after the file. */
async function sandboxFrom(params: { snapshot: string } | { image: Image | string }, options?: { onSnapshotCreateLogs?: (chunk: string) => void }): Promise<Sandbox> {
  const sandbox = await env.daytona.create({ networkBlockAll: true, ...params } as never, { timeout: 0, ...options });
  created.push(sandbox);
  return sandbox;
}

const run = async (sandbox: Sandbox, cmd: string) => (await sandbox.process.executeCommand(cmd)).result;

/** The native API's builds of an image name (what the on-demand dedupe must not multiply). */
async function buildsNamed(name: string): Promise<{ id: string; state: string }[]> {
  const res = await rawFetch(env, `/api/v1/builds?name=${encodeURIComponent(name)}`);
  expect(res.status).toBe(200);
  const body = (await res.json()) as { items?: { id: string; state: string }[] } | { id: string; state: string }[];
  return Array.isArray(body) ? body : (body.items ?? []);
}

describe('daytona.snapshot.create from an Image', () => {
  it('builds FROM a registry image with runCommands, addLocalDir, env and workdir; logs stream; sandboxes see the result', async () => {
    const dir = join(work, 'ctx');
    mkdirSync(join(dir, 'sub'), { recursive: true });
    writeFileSync(join(dir, 'a.txt'), 'from the context\n');
    writeFileSync(join(dir, 'sub', 'b.txt'), 'nested\n');
    const image = Image.base(busybox).runCommands('echo built > /built.txt').addLocalDir(dir, '/app').env({ GREETING: 'hello world' }).workdir('/app');
    const logs: string[] = [];
    const snapshot = await env.daytona.snapshot.create({ name: 'img-ctx', image, resources: { cpu: 2, memory: 2 } }, { onLogs: (chunk) => logs.push(chunk) });
    expect(snapshot.state).toBe('active');
    expect(snapshot.name).toBe('img-ctx');
    const text = logs.join('\n');
    // The SDK's own lines around the server's build log, streamed from build-logs-url.
    expect(text).toContain('Creating snapshot img-ctx');
    expect(text).toContain('Created snapshot img-ctx (active)');
    expect(text).toMatch(/Step \d+\/\d+ : RUN echo built > \/built.txt/);
    expect(text).toContain(`FROM ${busybox}`);

    const sandbox = await sandboxFrom({ snapshot: 'img-ctx' });
    expect(sandbox.snapshot).toBe('img-ctx');
    expect(await run(sandbox, 'cat /built.txt /app/a.txt /app/sub/b.txt')).toBe('built\nfrom the context\nnested\n');
    expect(await run(sandbox, 'echo "$GREETING"')).toBe('hello world\n');
    expect(await sandbox.getWorkDir()).toBe('/app');
    // The snapshot's resources are the sandbox's defaults.
    expect(sandbox.cpu).toBe(2);
    expect(sandbox.memory).toBe(2);

    const got = await env.daytona.snapshot.get('img-ctx');
    expect(got).toMatchObject({ id: snapshot.id, name: 'img-ctx', state: 'active', cpu: 2, mem: 2 });
    const list = await env.daytona.snapshot.list();
    expect(list.items.map((s) => s.name)).toEqual(expect.arrayContaining(['img-ctx', 'default']));
    expect((await env.daytona.snapshot.activate(got)).state).toBe('active');

    // The name is taken (409, Daytona's message), whatever the new image is.
    const dup = await env.daytona.snapshot.create({ name: 'img-ctx', image: Image.base('default') }).catch((e: unknown) => e);
    expect(dup).toBeInstanceOf(DaytonaConflictError);
    expect((dup as DaytonaError).message).toBe('Snapshot with name "img-ctx" already exists for this organization');

    // In use by a sandbox: refused; once it is gone, the snapshot can go.
    const inUse = await env.daytona.snapshot.delete(got).catch((e: unknown) => e);
    expect(inUse).toBeInstanceOf(DaytonaConflictError);
    await sandbox.delete();
    await env.daytona.snapshot.delete(got);
    await expect(env.daytona.snapshot.get('img-ctx')).rejects.toBeInstanceOf(DaytonaNotFoundError);
  }, 600_000);

  it('a failing runCommands ends in build_failed with the reason, and the SDK fails with it', async () => {
    const image = Image.base('default').runCommands('echo about to fail; exit 3');
    const logs: string[] = [];
    const err = await env.daytona.snapshot.create({ name: 'img-fail', image }, { onLogs: (c) => logs.push(c) }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DaytonaError);
    expect((err as Error).message).toMatch(/^Failed to create snapshot\. Name: img-fail Reason: .*returned a non-zero code: 3/s);
    expect((err as Error).message).toContain('about to fail');
    expect(logs.join('\n')).toContain('about to fail');
    const got = await env.daytona.snapshot.get('img-fail');
    expect(got.state).toBe('build_failed');
    expect(got.errorReason).toMatch(/non-zero code: 3/);
    // A sandbox cannot start from it; a failed name can be built again.
    await expect(env.daytona.create({ snapshot: 'img-fail', networkBlockAll: true })).rejects.toThrow(/build_failed/);
    const again = await env.daytona.snapshot.create({ name: 'img-fail', image: Image.base('default').runCommands('true') });
    expect(again.state).toBe('active');
    await env.daytona.snapshot.delete(again);
    await expect(env.daytona.snapshot.get('img-fail')).rejects.toBeInstanceOf(DaytonaNotFoundError);
    expect((await env.daytona.snapshot.list()).items.map((s) => s.name)).not.toContain('img-fail');
  }, 600_000);

  it('Image.fromDockerfile copies the Dockerfile\'s context files', async () => {
    const dir = join(work, 'df');
    mkdirSync(join(dir, 'ctx'), { recursive: true });
    writeFileSync(join(dir, 'ctx', 'one.txt'), 'one\n');
    writeFileSync(join(dir, 'two.txt'), 'two\n');
    // The CMD runs in the background of every sandbox, as Daytona's daemon runs it.
    writeFileSync(join(dir, 'Dockerfile'), 'FROM default\nCOPY ctx /opt/ctx\nCOPY two.txt /opt/two.txt\nENV FROM_DOCKERFILE=yes\nCMD ["sh", "-c", "echo \\"cmd ran: $FROM_DOCKERFILE\\" > /tmp/cmd.txt; exec sleep 3600"]\n');
    const snapshot = await env.daytona.snapshot.create({ name: 'img-df', image: Image.fromDockerfile(join(dir, 'Dockerfile')) });
    expect(snapshot.state).toBe('active');
    const sandbox = await sandboxFrom({ snapshot: 'img-df' });
    expect(await run(sandbox, 'cat /opt/ctx/one.txt /opt/two.txt; echo $FROM_DOCKERFILE')).toBe('one\ntwo\nyes\n');
    let cmdOutput = '';
    for (let i = 0; i < 60 && !cmdOutput; i++) {
      cmdOutput = await run(sandbox, 'cat /tmp/cmd.txt 2>/dev/null || true');
      if (!cmdOutput) await new Promise((r) => setTimeout(r, 500));
    }
    expect(cmdOutput).toBe('cmd ran: yes\n');
  }, 600_000);

  it('an image name with an entrypoint: pulled from the registry, or a Nestbox image; the entrypoint runs in each sandbox', async () => {
    const pulled = await env.daytona.snapshot.create({ name: 'img-pulled', image: busybox });
    expect(pulled.state).toBe('active');
    expect(pulled.imageName).toBe(busybox);
    const named = await env.daytona.snapshot.create({ name: 'img-ep', image: 'default', entrypoint: ['sh', '-c', 'echo "entrypoint ran" > /tmp/ep.txt; exec sleep 3600'] });
    expect(named.state).toBe('active');
    const sandbox = await sandboxFrom({ snapshot: 'img-ep' });
    let out = '';
    for (let i = 0; i < 60 && !out; i++) {
      out = await run(sandbox, 'cat /tmp/ep.txt 2>/dev/null || true');
      if (!out) await new Promise((r) => setTimeout(r, 500));
    }
    expect(out).toBe('entrypoint ran\n');
    // One reference, not Dockerfile text.
    const bad = await rawFetch(env, '/daytona/api/snapshots', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ name: 'img-inject', imageName: 'default\nRUN true' }) });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { message: string }).message).toMatch(/imageName/);
  }, 600_000);

  it('an unsupported Dockerfile line is a 400 naming it', async () => {
    const err = await env.daytona.snapshot.create({ name: 'img-bad', image: Image.base('default').dockerfileCommands(['ONBUILD RUN true']) }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DaytonaError);
    expect((err as DaytonaError).statusCode).toBe(400);
    expect((err as Error).message).toMatch(/buildInfo\.dockerfileContent: line 2: .*ONBUILD/);
  });
});

describe('daytona.create({image}) builds on demand', () => {
  it('streams the build log, starts from the built image, and a second create reuses the build', async () => {
    const image = Image.base('default').runCommands('echo on-demand > /od.txt').env({ OD: '1' });
    const ref = `daytona-${createHash('sha256').update(image.dockerfile).digest('hex')}`;
    const logs: string[] = [];
    const first = await sandboxFrom({ image }, { onSnapshotCreateLogs: (c) => logs.push(c) });
    expect(first.state).toBe('started');
    expect(logs.join('\n')).toMatch(/RUN echo on-demand > \/od.txt/);
    expect(await run(first, 'cat /od.txt; echo $OD')).toBe('on-demand\n1\n');
    expect(first.buildInfo?.snapshotRef).toBe(`${ref}:daytona`);
    expect(await buildsNamed(ref)).toHaveLength(1);

    // The same image again: no second build, straight to started.
    const second = await sandboxFrom({ image });
    expect(await run(second, 'cat /od.txt')).toBe('on-demand\n');
    expect(await buildsNamed(ref)).toHaveLength(1);

    // A new image, named, without a log callback: the SDK waits through pending_build on its own,
    // and its toolbox client, made with the id the create answered, reaches the built sandbox.
    const named = await sandboxFrom({ image: Image.base('default').runCommands('echo named > /named.txt'), name: 'od-named' } as never);
    expect(named.name).toBe('od-named');
    expect(named.state).toBe('started');
    expect(await run(named, 'cat /named.txt')).toBe('named\n');
    expect((await env.daytona.get('od-named')).id).toBe(named.id);
  }, 600_000);

  it('a failing build gives build_failed and the SDK\'s error', async () => {
    const image = Image.base('default').runCommands('echo on-demand failure; exit 5');
    const err = await sandboxFrom({ image }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DaytonaError);
    expect((err as Error).message).toMatch(/failed to start with status: build_failed, error reason: .*non-zero code: 5/s);
  }, 600_000);
});

// Image builds from Dockerfiles with uploaded contexts, multi-stage builds, start commands, OCI
// bases pulled from a real registry on loopback, and apt from Debian's mirror (issue 14).
import { createHash } from 'node:crypto';
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync, chmodSync } from 'node:fs';
import { join } from 'node:path';
import { create as createTar } from 'tar';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './harness.js';
import { buildTestImage, busyboxImageSpec, pushTestImage, startTestRegistry, type TestRegistry } from '../host/images/oci/test-registry.js';

let t: TestServer;
let registry: TestRegistry;
let privateRegistry: TestRegistry;
const CREDS = { username: 'builder', password: 'per-build secret' };
let work: string;

beforeAll(async () => {
  work = mkdtempSync('/tmp/nbx-build-');
  registry = await startTestRegistry();
  privateRegistry = await startTestRegistry({ htpasswd: CREDS });
  await pushTestImage(await buildTestImage(join(work, 'private'), busyboxImageSpec({ env: ['PATH=/bin', 'PRIVATE=yes'] })), `${privateRegistry.host}/team/private:1`, CREDS);
  await pushTestImage(await buildTestImage(join(work, 'busybox'), busyboxImageSpec({ env: ['PATH=/bin', 'FROM_IMAGE=yes'], workingDir: '/srv' })), `${registry.host}/test/busybox:1`);
  t = await startTestServer();
}, 300_000);
afterAll(async () => {
  await t?.close();
  await registry?.stop();
  await privateRegistry?.stop();
  rmSync(work, { recursive: true, force: true });
});

const NO_EGRESS = { mode: 'deny-all' };

/** A context tar of `files` (path → content), uploaded by digest; answers the digest. */
async function uploadContext(files: Record<string, string | { content: string; mode: number }>): Promise<string> {
  const dir = mkdtempSync(join(work, 'ctx-'));
  for (const [path, value] of Object.entries(files)) {
    mkdirSync(join(dir, path, '..'), { recursive: true });
    writeFileSync(join(dir, path), typeof value === 'string' ? value : value.content);
    if (typeof value !== 'string') chmodSync(join(dir, path), value.mode);
  }
  const chunks: Buffer[] = [];
  for await (const chunk of createTar({ cwd: dir, portable: true, gzip: true }, Object.keys(files))) chunks.push(chunk as Buffer);
  const body = Buffer.concat(chunks);
  const sha = createHash('sha256').update(body).digest('hex');
  const res = await t.http.put(`/api/v1/build-contexts/${sha}`).set(t.auth).set('content-type', 'application/gzip').send(body);
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  expect(res.body).toMatchObject({ sha256: sha, size: body.length });
  return sha;
}

async function buildAndWait(body: Record<string, unknown>) {
  const res = await t.http.post('/api/v1/builds').set(t.auth).send({ egress: NO_EGRESS, ...body });
  expect(res.status, JSON.stringify(res.body)).toBe(202);
  const logs = await fetch(`${t.url}/api/v1/builds/${res.body.id}/logs`, { headers: { ...t.auth, accept: 'text/event-stream' } }).then((r) => r.text());
  const lines = logs.split('\n\n').filter((b) => b.includes('event: line')).map((b) => JSON.parse(/^data: (.*)$/m.exec(b)![1]!).text as string);
  const done = JSON.parse(/event: end\ndata: (.*)/.exec(logs)![1]!);
  return { build: done as { id: string; state: string; imageId: string; error: { message: string } | null }, lines };
}

async function sandboxOf(image: string) {
  const res = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ image, egress: NO_EGRESS });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body.id as string;
}

const sh = async (id: string, cmd: string, user?: string) => {
  const res = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd, ...(user ? { user } : {}) });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body as { exitCode: number; stdout: string; stderr: string };
};

describe('Dockerfile builds', () => {
  it('builds a multi-stage Dockerfile with a context: COPY, --chown, --from, ARG, ENV, USER, WORKDIR', async () => {
    const context = await uploadContext({ 'app/main.py': 'print("from the context")\n', 'app/run.sh': { content: '#!/bin/sh\necho run\n', mode: 0o755 }, 'notes.txt': 'notes\n', 'secret.key': 'never copied\n' });
    const dockerfile = [
      'ARG BASE=default',
      'FROM ${BASE} AS builder',
      'ARG GREETING=hello',
      'WORKDIR /build',
      'RUN echo "$GREETING from the builder" > artifact.txt',
      '',
      'FROM default',
      'ENV APP_HOME=/opt/app',
      'WORKDIR $APP_HOME',
      'COPY app/ ./',
      'COPY --chown=user:user notes.txt /home/user/',
      'COPY --from=builder /build/artifact.txt /opt/app/artifact.txt',
      'USER user',
      'RUN id -un > /home/user/whoami && test ! -e /opt/app/secret.key',
      'LABEL stage=final',
    ].join('\n');
    const { build, lines } = await buildAndWait({ name: 'df-multi', dockerfile, contexts: [context], buildArgs: { GREETING: 'bonjour' }, ignore: ['secret.key'] });
    expect(build.state, `${JSON.stringify(build.error)}\n${lines.join('\n')}`).toBe('succeeded');
    const id = await sandboxOf('df-multi');
    expect((await sh(id, 'cat /opt/app/main.py /opt/app/artifact.txt /home/user/notes.txt /home/user/whoami')).stdout).toBe('print("from the context")\nbonjour from the builder\nnotes\nuser\n');
    expect((await sh(id, 'stat -c %a /opt/app/run.sh; stat -c %U /home/user/notes.txt; stat -c %U /opt/app/main.py')).stdout).toBe('755\nuser\nroot\n');
    expect((await sh(id, 'echo $APP_HOME')).stdout).toBe('/opt/app\n');
    const image = (await t.http.get('/api/v1/images/df-multi').set(t.auth)).body;
    expect(image.config).toMatchObject({ user: 'user', workdir: '/opt/app', labels: { stage: 'final' } });

    // The same build again is all cache; a changed context file misses from its COPY on.
    const again = await buildAndWait({ name: 'df-multi', dockerfile, contexts: [context], buildArgs: { GREETING: 'bonjour' }, ignore: ['secret.key'] });
    expect(again.build.state).toBe('succeeded');
    expect(again.lines.filter((l) => l.includes('Using cache')).length).toBe(again.lines.filter((l) => l.includes(' ---> ')).length);
    const changed = await uploadContext({ 'app/main.py': 'print("changed")\n', 'app/run.sh': { content: '#!/bin/sh\necho run\n', mode: 0o755 }, 'notes.txt': 'notes\n', 'secret.key': 'x\n' });
    const third = await buildAndWait({ name: 'df-multi', tags: ['changed'], dockerfile, contexts: [changed], buildArgs: { GREETING: 'bonjour' }, ignore: ['secret.key'] });
    expect(third.build.state).toBe('succeeded');
    const copyStep = third.lines.findIndex((l) => l.includes('COPY app/ ./'));
    // The builder stage and the final stage's steps before the COPY come from the cache; the COPY does not.
    expect(third.lines.slice(0, copyStep).some((l) => l.includes('Using cache'))).toBe(true);
    expect(third.lines.slice(copyStep, copyStep + 3).some((l) => l.includes('Using cache'))).toBe(false);
    const changedBox = await sandboxOf('df-multi:changed');
    expect((await sh(changedBox, 'cat /opt/app/main.py')).stdout).toBe('print("changed")\n');
  }, 400_000);

  it('builds FROM an OCI image pulled from a registry, and runs it', async () => {
    const { build, lines } = await buildAndWait({ name: 'from-registry', dockerfile: `FROM ${registry.host}/test/busybox:1\nRUN echo built > /built.txt\nENV ADDED=1\n` });
    expect(build.state, lines.join('\n')).toBe('succeeded');
    expect(lines.some((l) => l.includes('pulling'))).toBe(true);
    const id = await sandboxOf('from-registry');
    expect((await sh(id, 'cat /built.txt; echo $FROM_IMAGE $ADDED; cat /etc/os-release')).stdout).toMatch(/^built\nyes 1\nNAME="Nestbox test busybox"/);
    // Its size: the pulled base (a static busybox, about 1 MB or more) plus its layer.
    const image = (await t.http.get('/api/v1/images/from-registry').set(t.auth)).body;
    expect(image.sizeBytes).toBeGreaterThan(500_000);
    expect(image.source).toMatchObject({ kind: 'build', from: [expect.stringMatching(/test\/busybox:1@sha256:/)] });
  }, 300_000);

  it('builds FROM scratch: an empty base, filled from an earlier stage (a static binary), run by argv', async () => {
    const dockerfile = [`FROM ${registry.host}/test/busybox:1 AS tools`, 'RUN echo "made in stage 1" > /note', 'FROM scratch', 'COPY --from=tools /bin/busybox /bin/busybox', 'COPY --from=tools /note /note', 'ENV PATH=/bin'].join('\n');
    const { build, lines } = await buildAndWait({ name: 'from-scratch', dockerfile });
    expect(build.state, lines.join('\n')).toBe('succeeded');
    const id = await sandboxOf('from-scratch');
    const res = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ argv: ['/bin/busybox', 'cat', '/note'] });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.stdout).toBe('made in stage 1\n');
    // Nothing else is in it: no shell, so a cmd is refused and asks for argv.
    const ls = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ argv: ['/bin/busybox', 'ls', '/bin'] });
    expect(ls.body.stdout).toBe('busybox\n');
    const shell = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd: 'echo hi' });
    expect(shell.status).toBe(400);
  }, 300_000);

  it('pulls an image by name (POST /images) and deletes it when unused', async () => {
    const res = await t.http.post('/api/v1/images').set(t.auth).send({ reference: `${registry.host}/test/busybox:1`, name: 'pulled-busybox' });
    expect(res.status, JSON.stringify(res.body)).toBe(202);
    expect(res.body.tags).toEqual(['1']);
    const logs = await fetch(`${t.url}/api/v1/builds/${res.body.id}/logs`, { headers: { ...t.auth, accept: 'text/event-stream' } }).then((r) => r.text());
    expect(logs).toMatch(/"state":"succeeded"/);
    const image = (await t.http.get('/api/v1/images/pulled-busybox:1').set(t.auth)).body;
    expect(image.base).toMatch(/^sha256:[a-f0-9]{64}$/);
    expect(image.config.env).toMatchObject({ FROM_IMAGE: 'yes' });
    const id = await sandboxOf('pulled-busybox:1');
    expect((await sh(id, 'pwd; echo $FROM_IMAGE')).stdout).toBe('/srv\nyes\n');
    expect((await t.http.delete('/api/v1/images/pulled-busybox:1').set(t.auth)).status).toBe(409);
    expect((await t.http.delete(`/api/v1/sandboxes/${id}`).set(t.auth)).status).toBe(204);
    expect((await t.http.delete('/api/v1/images/pulled-busybox:1').set(t.auth)).status).toBe(204);
    const list = (await t.http.get('/api/v1/images?all=true').set(t.auth)).body.items as { id: string }[];
    expect(list.map((i) => i.id)).not.toContain(image.id);
    // Its pulled base stays on the host while another image (from-registry) starts from it…
    const host = await t.server.services.hosts.clientFor(((await t.server.db('hosts').first()) as { id: string }).id);
    expect((await host.listImages()).map((i) => i.id)).toContain(image.base);
    // …and goes with the last image and cached step that use it.
    const fromRegistry = (await t.http.get('/api/v1/images/from-registry').set(t.auth)).body;
    expect(fromRegistry.base).toBe(image.base);
    for (const s of (await t.http.get('/api/v1/sandboxes').set(t.auth)).body.items as { id: string }[]) await t.http.delete(`/api/v1/sandboxes/${s.id}`).set(t.auth);
    expect((await t.http.delete('/api/v1/images/from-registry').set(t.auth)).status).toBe(204);
    await t.server.services.images.expireCache(new Date(Date.now() + 3600_000));
    expect((await host.listImages()).map((i) => i.id)).not.toContain(image.base);
  }, 300_000);

  it("pulls FROM a private registry with the build's own credentials, which are never stored or shown", async () => {
    const dockerfile = `FROM ${privateRegistry.host}/team/private:1\nRUN echo $PRIVATE > /private.txt\n`;
    const refused = await buildAndWait({ name: 'from-private', dockerfile });
    expect(refused.build.state).toBe('failed');
    expect(refused.build.error!.message).toMatch(/unauthorized|credentials|authentication/i);
    const ok = await buildAndWait({ name: 'from-private', dockerfile, credentials: CREDS });
    expect(ok.build.state, ok.lines.join('\n')).toBe('succeeded');
    const id = await sandboxOf('from-private');
    expect((await sh(id, 'cat /private.txt')).stdout).toBe('yes\n');
    // The password is nowhere: not in the build, its log, the server's log or the database.
    const stored = JSON.stringify(await t.server.db('image_builds').select('*'));
    expect(stored).not.toContain(CREDS.password);
    expect(ok.lines.join('\n')).not.toContain(CREDS.password);
    expect(t.logs.join('\n')).not.toContain(CREDS.password);
  }, 300_000);

  it('runs several builds at once', async () => {
    const starts = await Promise.all(['a', 'b', 'c'].map((n) => t.http.post('/api/v1/builds').set(t.auth).send({ name: `parallel-${n}`, steps: [{ run: `echo ${n} > /which; sleep 1` }], egress: NO_EGRESS })));
    for (const s of starts) expect(s.status).toBe(202);
    const principal = await t.server.services.auth.authenticate(t.apiKey);
    const done = await Promise.all(starts.map((s) => t.server.services.builds.waitFor(principal, s.body.id)));
    expect(done.map((b) => b.state)).toEqual(['succeeded', 'succeeded', 'succeeded']);
    // At most NESTBOX_MAX_CONCURRENT_BUILDS (2) ran at once: the third started after one ended.
    const [first, second, third] = done.sort((x, y) => x.startedAt!.getTime() - y.startedAt!.getTime());
    expect(third!.startedAt!.getTime()).toBeGreaterThanOrEqual(Math.min(first!.finishedAt!.getTime(), second!.finishedAt!.getTime()));
  }, 300_000);

  it('fails a build whose FROM names nothing, at step 0', async () => {
    const { build } = await buildAndWait({ name: 'from-missing', dockerfile: `FROM ${registry.host}/test/no-such-image:1\nRUN true\n` });
    expect(build.state).toBe('failed');
    expect(build.error!.message).toMatch(/no-such-image/);
  }, 120_000);
});

describe('start commands', () => {
  it('runs the image start command at create and answers once its readiness check passes', async () => {
    const { build, lines } = await buildAndWait({
      name: 'with-server',
      steps: [
        { workdir: '/srv/www' },
        { run: 'echo served > index.html' },
        { start: { command: 'python3 -m http.server 8080', ready: { port: 8080 } } },
      ],
    });
    expect(build.state, lines.join('\n')).toBe('succeeded');
    expect(lines.some((l) => l.includes('ready: port 8080 listening passed'))).toBe(true);
    const id = await sandboxOf('with-server');
    // No waiting here: the create answered after the server listened.
    const res = await sh(id, `python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8080/index.html').read().decode().strip())"`);
    expect(res.stdout).toBe('served\n');
  }, 300_000);

  it('fails the build when the start command never gets ready (the finalize step)', async () => {
    const { build } = await buildAndWait({ name: 'never-ready', readyTimeoutSeconds: 3, steps: [{ start: { command: 'sleep 600', ready: { file: '/never' } } }] });
    expect(build.state).toBe('failed');
    expect(build.error).toMatchObject({ step: 'finalize' });
    expect(build.error!.message).toMatch(/not ready within 3 s/);
  }, 120_000);
});

describe('apt from Debian', () => {
  it('installs a Debian package in a build step (egress allowed to deb.debian.org only)', async () => {
    const { build, lines } = await buildAndWait({
      name: 'with-apt',
      egress: { mode: 'allow-list', allow: ['deb.debian.org'] },
      dockerfile: 'FROM default\nRUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cowsay\n',
    });
    expect(build.state, lines.slice(-30).join('\n')).toBe('succeeded');
    const id = await sandboxOf('with-apt');
    expect((await sh(id, '/usr/games/cowsay moo')).stdout).toContain('< moo >');
  }, 600_000);
});

describe('nestbox build (the CLI, a client of the API)', () => {
  it('builds a context directory with its Dockerfile and .dockerignore, printing the log, and exits 0', async () => {
    const dir = mkdtempSync(join(work, 'cli-'));
    writeFileSync(join(dir, 'Dockerfile'), 'FROM default\nCOPY . /app/\nRUN cat /app/hello.txt && test ! -e /app/ignored.log\n');
    writeFileSync(join(dir, 'hello.txt'), 'hello from the cli\n');
    writeFileSync(join(dir, 'ignored.log'), 'x\n');
    writeFileSync(join(dir, '.dockerignore'), '*.log\n');
    const run = (args: string[]) =>
      new Promise<{ code: number; stdout: string; stderr: string }>((done) => {
        execFile(process.execPath, [resolve(import.meta.dirname, '../dist/src/cli.js'), ...args], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', NESTBOX_URL: t.url, NESTBOX_API_KEY: t.apiKey, NESTBOX_DATA_DIR: dir }, timeout: 300_000 }, (error, stdout, stderr) =>
          done({ code: error ? Number((error as { code?: number }).code ?? 1) : 0, stdout, stderr }),
        );
      });
    const ok = await run(['build', '-t', 'cli-app:1', '--egress', 'deny-all', dir]);
    expect(ok.code, ok.stderr).toBe(0);
    expect(ok.stdout).toContain('hello from the cli');
    expect(ok.stdout).toMatch(/cli-app:1 img[a-z0-9]{17}\n$/);
    const id = await sandboxOf('cli-app:1');
    expect((await sh(id, 'cat /app/hello.txt; ls /app')).stdout).toBe('hello from the cli\nDockerfile\nhello.txt\n');
    // A failing build exits 1 with the reason on one line.
    writeFileSync(join(dir, 'Dockerfile'), 'FROM default\nRUN exit 7\n');
    const bad = await run(['build', '-t', 'cli-app:2', '--egress', 'deny-all', dir]);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/build failed: .*non-zero code: 7/);
  }, 300_000);
});

// Images and builds through the native API: real server, real PostgreSQL, real local driver,
// real build sandboxes (issue 14).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { createHash } from 'node:crypto';
import { startTestServer, type TestServer } from './harness.js';

let t: TestServer;

beforeAll(async () => {
  t = await startTestServer();
}, 180_000);
afterAll(async () => {
  await t?.close();
});

/** No build of these tests reaches outside (steps use no network). */
const NO_EGRESS = { mode: 'deny-all' };

async function build(body: Record<string, unknown>) {
  const res = await t.http.post('/api/v1/builds').set(t.auth).send({ egress: NO_EGRESS, ...body });
  expect(res.status, JSON.stringify(res.body)).toBe(202);
  return res.body as { id: string; state: string };
}

/** Follows the build's log as Server-Sent Events to its end; answers the lines and the finished build. */
async function follow(buildId: string, offset = 0): Promise<{ lines: { offset: number; text: string; stream: string }[]; done: { state: string; error: { message: string; exitCode?: number; logTail?: string[]; step?: number } | null; imageId: string | null } }> {
  const res = await fetch(`${t.url}/api/v1/builds/${buildId}/logs?offset=${offset}`, { headers: { ...t.auth, accept: 'text/event-stream' } });
  expect(res.status).toBe(200);
  const text = await res.text();
  const lines: { offset: number; text: string; stream: string }[] = [];
  let done: unknown;
  for (const block of text.split('\n\n')) {
    const event = /^event: (\w+)/m.exec(block)?.[1];
    const data = /^data: (.*)$/m.exec(block)?.[1];
    if (!event || !data) continue;
    if (event === 'line') lines.push(JSON.parse(data));
    if (event === 'end') done = JSON.parse(data);
  }
  expect(done, text.slice(-2000)).toBeDefined();
  return { lines, done: done as never };
}

const exec = async (id: string, cmd: string) => {
  const res = await t.http.post(`/api/v1/sandboxes/${id}/commands`).set(t.auth).send({ cmd });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body as { exitCode: number; stdout: string; stderr: string };
};

describe('builds from JSON steps', () => {
  it('builds an image, starts sandboxes from it, and answers an unchanged rebuild from the cache', async () => {
    const steps = [
      { run: 'echo hello > /hello.txt' },
      { env: { GREETING: 'hi there', DERIVED: '${GREETING}!', PATH: '$PATH:/opt/tools' } },
      { workdir: '/app/sub' },
      { run: 'pwd > /where.txt && echo "$GREETING" > greeting.txt' },
      { label: { purpose: 'test' } },
    ];
    const first = await build({ name: 'it-steps', tags: ['1', 'latest'], steps });
    const { lines, done } = await follow(first.id);
    expect(done.state, JSON.stringify(done.error) + lines.map((l) => l.text).join('\n')).toBe('succeeded');
    expect(lines.some((l) => l.text.startsWith('Step 4/5'))).toBe(true);
    // Offsets are consecutive from 0, so a follower can resume anywhere.
    expect(lines.map((l) => l.offset)).toEqual(lines.map((_, i) => i));

    const image = (await t.http.get('/api/v1/images/it-steps:1').set(t.auth)).body;
    expect(image.id).toBe(done.imageId);
    expect(image.references.sort()).toEqual(['it-steps:1', 'it-steps:latest']);
    expect(image.config.env).toMatchObject({ GREETING: 'hi there', DERIVED: 'hi there!' });
    expect(image.config.workdir).toBe('/app/sub');
    expect(image.config.labels).toMatchObject({ purpose: 'test' });
    // Each tree step's layer is in the history; metadata steps have none.
    const history = image.source.history as { step: number; layer: string | null; cached?: boolean }[];
    expect(history.map((h) => h.step)).toEqual([1, 2, 3, 4, 5]);
    expect(history.filter((h) => h.layer).map((h) => h.step)).toEqual([1, 4]);
    expect(image.layers[0].id).toBe(history[3]!.layer);

    const created = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ image: 'it-steps:1' });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    expect(created.body).toMatchObject({ image: 'it-steps:1', imageId: image.id });
    const sandboxId = created.body.id as string;
    expect((await exec(sandboxId, 'cat /hello.txt /where.txt /app/sub/greeting.txt')).stdout).toBe('hello\n/app/sub\nhi there\n');
    expect((await exec(sandboxId, 'echo "$GREETING|$DERIVED"')).stdout).toBe('hi there|hi there!\n');
    // PATH extended, not replaced: the image's own PATH came first (argv: no login shell resets it).
    const printenv = await t.http.post(`/api/v1/sandboxes/${sandboxId}/commands`).set(t.auth).send({ argv: ['/usr/bin/printenv', 'PATH'] });
    expect(printenv.body.stdout).toBe('/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/tools\n');

    // Deleting the image while a sandbox uses it is refused; a tag can go while another stays.
    expect((await t.http.delete('/api/v1/images/it-steps:latest').set(t.auth)).status).toBe(204);
    const inUse = await t.http.delete('/api/v1/images/it-steps:1').set(t.auth);
    expect(inUse.status).toBe(409);
    expect(inUse.body.error.code).toBe('conflict');

    // The same steps again: every tree step is a cache hit, so no build sandbox is made.
    const again = await build({ name: 'it-steps', tags: ['2'], steps });
    const rebuilt = await follow(again.id);
    expect(rebuilt.done.state).toBe('succeeded');
    expect(rebuilt.lines.filter((l) => l.text.includes('Using cache')).length, rebuilt.lines.map((l) => l.text).join('\n')).toBe(2);
    const buildSandboxes = await t.server.db('sandboxes').where({ kind: 'build' }).whereRaw(`labels->>'nestbox.build' = ?`, [again.id]);
    expect(buildSandboxes).toEqual([]);
    // Build sandboxes never show in lists.
    const listed = (await t.http.get('/api/v1/sandboxes').set(t.auth)).body.items as { id: string }[];
    expect(listed.map((s) => s.id)).toEqual([sandboxId]);

    // noCache rebuilds every step.
    const fresh = await build({ name: 'it-steps', tags: ['3'], steps, noCache: true });
    const uncached = await follow(fresh.id);
    expect(uncached.done.state).toBe('succeeded');
    expect(uncached.lines.filter((l) => l.text.includes('Using cache')).length).toBe(0);

    expect((await t.http.delete(`/api/v1/sandboxes/${sandboxId}`).set(t.auth)).status).toBe(204);
    expect((await t.http.delete('/api/v1/images/it-steps:1').set(t.auth)).status).toBe(204);
    expect((await t.http.get('/api/v1/images/it-steps:1').set(t.auth)).status).toBe(404);
  }, 300_000);

  it('ends a build at a failing step with its exit code and the last lines it printed, and leaves no sandbox', async () => {
    const b = await build({ name: 'it-fail', steps: [{ run: 'echo about to fail; echo oops >&2; exit 3' }, { run: 'echo never' }] });
    const { done } = await follow(b.id);
    expect(done.state).toBe('failed');
    expect(done.error).toMatchObject({ exitCode: 3, step: 1 });
    expect(done.error!.logTail).toEqual(expect.arrayContaining(['about to fail', 'oops']));
    expect(done.error!.message).toMatch(/non-zero code: 3/);
    const left = await t.server.db('sandboxes').where({ kind: 'build' }).whereNot({ state: 'deleted' }).whereRaw(`labels->>'nestbox.build' = ?`, [b.id]);
    expect(left).toEqual([]);
    expect((await t.http.get('/api/v1/images/it-fail').set(t.auth)).status).toBe(404);
  }, 180_000);

  it('cancels a running build', async () => {
    const b = await build({ name: 'it-cancel', steps: [{ run: 'echo started; sleep 600' }] });
    // Wait until the step runs (its first line is in the log).
    for (let i = 0; i < 600; i++) {
      const logs = (await t.http.get(`/api/v1/builds/${b.id}/logs`).set(t.auth)).body as { lines: { text: string }[] };
      if (logs.lines.some((l) => l.text === 'started')) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    const cancelled = await t.http.post(`/api/v1/builds/${b.id}/cancel`).set(t.auth);
    expect(cancelled.status).toBe(200);
    expect(cancelled.body.state).toBe('cancelled');
    const left = await t.server.db('sandboxes').where({ kind: 'build' }).whereNot({ state: 'deleted' }).whereRaw(`labels->>'nestbox.build' = ?`, [b.id]);
    expect(left).toEqual([]);
  }, 180_000);
});

describe('bad build requests', () => {
  it('refuses an instruction Nestbox cannot honour with a 400 naming the line', async () => {
    const res = await t.http.post('/api/v1/builds').set(t.auth).send({ name: 'x', dockerfile: 'FROM default\nRUN echo ok\nONBUILD RUN echo later\n' });
    expect(res.status).toBe(400);
    expect(res.body.error.code).toBe('validation_failed');
    expect(res.body.error.message).toMatch(/line 3/);
    expect(res.body.error.details).toMatchObject({ field: 'dockerfile', line: 3 });
  });

  it('names the field of a bad JSON step', async () => {
    const res = await t.http.post('/api/v1/builds').set(t.auth).send({ name: 'x', steps: [{ run: 'true' }, { copy: { src: 'a' } }] });
    expect(res.status).toBe(400);
    expect(res.body.error.details.field).toMatch(/^steps\[1\]\.copy/);
  });

  it('refuses a sandbox of an unknown image and a build of an unknown context', async () => {
    const res = await t.http.post('/api/v1/sandboxes').set(t.auth).send({ image: 'no-such-image:1' });
    expect(res.status).toBe(400);
    expect(res.body.error.details.field).toBe('image');
    const ctx = await t.http.post('/api/v1/builds').set(t.auth).send({ name: 'x', dockerfile: 'FROM default\nCOPY a /a\n', contexts: ['0'.repeat(64)] });
    expect(ctx.status).toBe(400);
    expect(ctx.body.error.details.field).toBe('contexts');
  });
});

describe('build logs over a WebSocket, and organisations', () => {
  it('replays a build log from an offset over a WebSocket and ends with the build', async () => {
    const b = await build({ name: 'it-ws', steps: [{ run: 'for i in 1 2 3; do echo line$i; done' }] });
    const ws = new WebSocket(`${t.url.replace('http', 'ws')}/api/v1/builds/${b.id}/logs?offset=1`, { headers: t.auth });
    const messages: { type: string; offset?: number; text?: string; build?: { state: string } }[] = [];
    const closed = await new Promise<number>((resolve, reject) => {
      ws.on('message', (data) => messages.push(JSON.parse(String(data))));
      ws.on('close', (code) => resolve(code));
      ws.on('error', reject);
    });
    expect(closed).toBe(1000);
    const lines = messages.filter((m) => m.type === 'line');
    expect(lines[0]!.offset).toBe(1);
    expect(lines.map((l) => l.text)).toEqual(expect.arrayContaining(['line1', 'line2', 'line3']));
    expect(messages[messages.length - 1]).toMatchObject({ type: 'end', build: { state: 'succeeded' } });
  }, 180_000);

  it("never shows one organisation's images, builds or contexts to another", async () => {
    const org = await t.server.services.auth.createOrganization('images-other');
    const key = await t.server.services.auth.createApiKey(org.id, { name: 'other', preset: 'admin' });
    const other = { Authorization: `Bearer ${key.key}` };
    const b = await build({ name: 'it-private', steps: [{ run: 'echo private > /p' }] });
    const finished = await t.server.services.builds.waitFor(await t.server.services.auth.authenticate(t.apiKey), b.id);
    expect(finished.state).toBe('succeeded');
    expect((await t.http.get('/api/v1/images/it-private').set(other)).status).toBe(404);
    expect((await t.http.get(`/api/v1/images/${finished.imageId}`).set(other)).status).toBe(404);
    expect((await t.http.delete('/api/v1/images/it-private').set(other)).status).toBe(404);
    expect((await t.http.get(`/api/v1/builds/${b.id}`).set(other)).status).toBe(404);
    expect((await t.http.get(`/api/v1/builds/${b.id}/logs`).set(other)).status).toBe(404);
    expect((await t.http.post(`/api/v1/builds/${b.id}/cancel`).set(other)).status).toBe(404);
    const listed = (await t.http.get('/api/v1/images').set(other)).body.items as { name: string }[];
    expect(listed.map((i) => i.name)).toEqual(['default', 'code-interpreter']);
    expect((await t.http.post('/api/v1/sandboxes').set(other).send({ image: 'it-private' })).status).toBe(400);
    // A context is per organisation too.
    const body = Buffer.from('not really a tar');
    const sha = createHash('sha256').update(body).digest('hex');
    expect((await t.http.put(`/api/v1/build-contexts/${sha}`).set(t.auth).set('content-type', 'application/x-tar').send(body)).status).toBe(201);
    expect((await t.http.get(`/api/v1/build-contexts/${sha}`).set(t.auth)).status).toBe(200);
    expect((await t.http.get(`/api/v1/build-contexts/${sha}`).set(other)).status).toBe(404);
    // A body whose digest is not the one named is refused and not kept.
    const wrong = await t.http.put(`/api/v1/build-contexts/${'1'.repeat(64)}`).set(t.auth).set('content-type', 'application/x-tar').send(body);
    expect(wrong.status).toBe(400);
    expect((await t.http.get(`/api/v1/build-contexts/${'1'.repeat(64)}`).set(t.auth)).status).toBe(404);
  }, 180_000);
});

// A control plane killed with kill -9 in the middle of a build: the build ends as failed (not
// stuck running), its build sandbox is removed, and nothing is tagged (issue 14).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServerProcess, waitFor, type TestServerProcess } from './harness.js';

let s: TestServerProcess;

beforeAll(async () => {
  s = await startServerProcess();
}, 180_000);
afterAll(async () => {
  await s?.close();
});

describe('a build interrupted by kill -9', () => {
  it('is failed by the next control plane, with its sandbox gone and no image', async () => {
    const res = await s.http.post('/api/v1/builds').set(s.auth).send({ name: 'crashy', steps: [{ run: 'echo started; sleep 600' }, { run: 'echo never' }], egress: { mode: 'deny-all' } });
    expect(res.status, JSON.stringify(res.body)).toBe(202);
    const buildId = res.body.id as string;
    const sandboxId = await waitFor('the step to run', async () => {
      const logs = await s.http.get(`/api/v1/builds/${buildId}/logs`).set(s.auth);
      const lines = (logs.body.lines as { text: string }[] | undefined) ?? [];
      return lines.some((l) => l.text === 'started') ? /build sandbox ([a-z0-9]+)/.exec(lines.map((l) => l.text).join('\n'))?.[1] : undefined;
    }, 120_000);
    expect((await s.http.get(`/api/v1/sandboxes/${sandboxId}`).set(s.auth)).status).toBe(200);
    const worker = s.workerPid()!;
    process.kill(worker, 'SIGKILL');
    // The supervisor starts a new worker; the build's owner is gone, so it is failed.
    const failed = await waitFor('the build to be failed', async () => {
      const got = await s.http.get(`/api/v1/builds/${buildId}`).set(s.auth).catch(() => undefined);
      return got?.status === 200 && got.body.state === 'failed' ? got.body : undefined;
    }, 120_000, 500);
    expect(s.workerPid()).not.toBe(worker);
    expect(failed.error.message).toMatch(/control plane/);
    expect((await s.http.get('/api/v1/images/crashy').set(s.auth)).status).toBe(404);
    // Its build sandbox goes too (it was adopted by the new host agent, then deleted).
    await waitFor('no build sandbox left', async () => ((await s.http.get(`/api/v1/sandboxes/${sandboxId}`).set(s.auth)).status === 404 ? true : undefined), 60_000, 500);
    // The same build again works (the first step's result was never cached: it did not finish).
    const again = await s.http.post('/api/v1/builds').set(s.auth).send({ name: 'crashy', steps: [{ run: 'echo fine' }], egress: { mode: 'deny-all' } });
    expect(again.status).toBe(202);
    const done = await waitFor('the second build', async () => {
      const got = await s.http.get(`/api/v1/builds/${again.body.id}`).set(s.auth);
      return ['succeeded', 'failed'].includes(got.body.state) ? got.body : undefined;
    }, 120_000, 500);
    expect(done.state).toBe('succeeded');
  }, 400_000);
});

// sandbox.resize({cpu, memory, disk}) through the real @daytonaio/sdk (daytona-wave2 §7): a
// running sandbox's memory and CPU change live (free, nproc and the enforced limit follow), a
// stopped one's disk grows (df after the start), and the rules give 4xx, never a 500.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { rawFetch, startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

let env: DaytonaTestEnv;

beforeAll(async () => {
  env = await startDaytonaEnv();
}, 180_000);

afterAll(async () => {
  await env?.server.close();
}, 120_000);

describe('Daytona resize', () => {
  it('resizes memory and CPU of a started sandbox live, and grows the disk of a stopped one', async () => {
    // The SDK's types tie `resources` to an image; the default snapshot takes them as well.
    const sb = await env.daytona.create({ resources: { cpu: 1, memory: 1, disk: 2 } } as unknown as Parameters<typeof env.daytona.create>[0]);
    try {
      const run = async (cmd: string) => (await sb.process.executeCommand(cmd, undefined, undefined, 60)).result.trim();
      expect(await run("free -m | awk '/^Mem:/ {print $2}'")).toBe('1024');
      expect(await run('nproc')).toBe('1');
      const alloc = "python3 -c \"x = bytearray(1300 * 1024 * 1024); print('ALLOC' + 'ATED')\" 2>&1 || echo killed";
      expect(await run(alloc)).not.toContain('ALLOCATED');

      await sb.resize({ memory: 2 });
      expect(sb.memory).toBe(2);
      expect(sb.state).toBe('started');
      expect(await run("free -m | awk '/^Mem:/ {print $2}'")).toBe('2048');
      expect(await run(alloc)).toContain('ALLOCATED');
      // The server's view agrees.
      expect((await env.daytona.get(sb.id)).memory).toBe(2);

      // A decrease, live: enforced again.
      await sb.resize({ memory: 1 });
      expect(await run("free -m | awk '/^Mem:/ {print $2}'")).toBe('1024');
      expect(await run(alloc)).not.toContain('ALLOCATED');

      // The disk grows only while stopped.
      const live = await rawFetch(env, `/daytona/api/sandbox/${sb.id}/resize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ disk: 3 }) });
      expect(live.status).toBeGreaterThanOrEqual(400);
      expect(live.status).toBeLessThan(500);
      await sb.stop();
      await sb.resize({ disk: 3 });
      expect(sb.disk).toBe(3);
      expect(sb.state).toBe('stopped');
      await sb.start();
      const size = Number(await run('df -B1 --output=size / | tail -1'));
      expect(size).toBeGreaterThan(2.8 * 2 ** 30);
    } finally {
      await sb.delete();
    }
  }, 300_000);

  it('refuses bad input with a 400 naming the field, and nothing to change', async () => {
    const sb = await env.daytona.create();
    try {
      const post = (body: unknown) => rawFetch(env, `/daytona/api/sandbox/${sb.id}/resize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      for (const [body, field] of [[{ memory: 0 }, 'memory'], [{ cpu: 1.5 }, 'cpu'], [{ disk: -1 }, 'disk'], [{ cpu: 'two' }, 'cpu']] as const) {
        const res = await post(body);
        expect(res.status, JSON.stringify(body)).toBe(400);
        expect(await res.text()).toContain(field);
      }
      const empty = await post({});
      expect(empty.status).toBe(400);
      expect(await empty.text()).toContain('No resource changes specified');
      // Disks never shrink.
      await sb.stop();
      const shrink = await post({ disk: 1 });
      expect(shrink.status).toBe(400);
      expect(await shrink.text()).toContain('only grow');
      // Another organisation's key sees no such sandbox.
      expect((await rawFetch(env, `/daytona/api/sandbox/nosuchsandbox/resize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ cpu: 1 }) })).status).toBe(404);
    } finally {
      await sb.delete();
    }
  }, 180_000);
});

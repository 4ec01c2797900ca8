// Own limits and resize through the native API, end to end (real server, PostgreSQL, local
// driver with LXCFS): `free`, `nproc`, `/proc/uptime` and `df` inside show the sandbox; PATCH
// cpu/memoryMiB changes a running sandbox live (seen and enforced), diskGiB grows a stopped one;
// the rules, org limits and another organisation's key.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './harness.js';

let t: TestServer;

beforeAll(async () => {
  t = await startTestServer({ env: { NESTBOX_ORG_MAX_MEMORY_MIB: '2048', NESTBOX_DEFAULT_DISK_GIB: '1', NESTBOX_MAX_DISK_GIB: '4' } });
}, 180_000);
afterAll(async () => {
  await t?.close();
}, 180_000);

const api = '/api/v1/sandboxes';
const run = async (id: string, cmd: string) => ((await t.http.post(`${api}/${id}/commands`).set(t.auth).send({ cmd, timeoutMs: 60_000 })).body.stdout as string).trim();
const patch = (id: string, body: Record<string, unknown>) => t.http.patch(`${api}/${id}`).set(t.auth).send(body);
const free = (id: string) => run(id, "free -m | awk '/^Mem:/ {print $2}'");
const ALLOC = (mib: number) => `python3 -c "x = bytearray(${mib} * 1024 * 1024); print('ALLOC' + 'ATED')" 2>&1 || echo killed`;

describe('own limits and resize (native API)', () => {
  it('free shows 512 in a 512 MiB sandbox, nproc 1 in a 1-vCPU one, its own uptime and its disk quota', async () => {
    const created = await t.http.post(api).set(t.auth).send({ cpu: 1, memoryMiB: 512 });
    expect(created.status).toBe(201);
    const id = created.body.id as string;
    expect(await free(id)).toBe('512');
    expect(await run(id, 'nproc')).toBe('1');
    expect(await run(id, 'grep -c ^processor /proc/cpuinfo')).toBe('1');
    expect(Number(await run(id, 'cut -d" " -f1 /proc/uptime'))).toBeLessThan(60);
    const size = Number(await run(id, 'df -B1 --output=size / | tail -1'));
    expect(size).toBeGreaterThan(0.85 * 2 ** 30);
    expect(size).toBeLessThanOrEqual(2 ** 30);
    await t.http.delete(`${api}/${id}`).set(t.auth);
  });

  it('a live memory resize is seen by free and enforced; cpu by nproc; the disk grows while stopped', async () => {
    const id = (await t.http.post(api).set(t.auth).send({ cpu: 1, memoryMiB: 256 })).body.id as string;
    expect(await run(id, ALLOC(400))).not.toContain('ALLOCATED');
    const up = await patch(id, { memoryMiB: 768 });
    expect(up.status).toBe(200);
    expect(up.body).toMatchObject({ state: 'running', memoryMiB: 768 });
    expect(await free(id)).toBe('768');
    expect(await run(id, ALLOC(400))).toContain('ALLOCATED');
    const down = await patch(id, { memoryMiB: 256 });
    expect(down.body.memoryMiB).toBe(256);
    expect(await free(id)).toBe('256');
    expect(await run(id, ALLOC(400))).not.toContain('ALLOCATED');
    const cpus = Number(await run(id, 'getconf _NPROCESSORS_CONF'));
    if (cpus >= 2) {
      expect((await patch(id, { cpu: 2 })).body.cpu).toBe(2);
      expect(await run(id, 'nproc')).toBe('2');
      await patch(id, { cpu: 1 });
      expect(await run(id, 'nproc')).toBe('1');
    }
    // Over the organisation's memory limit (2048 MiB): 429, nothing changed.
    const over = await patch(id, { memoryMiB: 4096 });
    expect(over.status).toBe(429);
    expect(over.body.error.code).toBe('quota_exceeded');
    expect(await free(id)).toBe('256');
    // The disk: only while stopped, only up.
    const live = await patch(id, { diskGiB: 2 });
    expect(live.status).toBe(409);
    expect(live.body.error.code).toBe('invalid_state');
    await t.http.post(`${api}/${id}/stop`).set(t.auth);
    const grown = await patch(id, { diskGiB: 2, labels: { grown: 'yes' } });
    expect(grown.status).toBe(200);
    expect(grown.body).toMatchObject({ state: 'stopped', diskGiB: 2, labels: { grown: 'yes' } });
    const shrink = await patch(id, { diskGiB: 1 });
    expect(shrink.status).toBe(400);
    expect(shrink.body.error.message).toMatch(/^diskGiB: disks only grow/);
    // A stopped sandbox's memory: its next start.
    expect((await patch(id, { memoryMiB: 384 })).body.memoryMiB).toBe(384);
    expect((await t.http.post(`${api}/${id}/resume`).set(t.auth)).status).toBe(200);
    expect(await free(id)).toBe('384');
    expect(Number(await run(id, 'df -B1 --output=size / | tail -1'))).toBeGreaterThan(1.8 * 2 ** 30);
    await t.http.delete(`${api}/${id}`).set(t.auth);
  }, 180_000);

  it('bad input is a 400 naming the field; a paused sandbox is not resized', async () => {
    const id = (await t.http.post(api).set(t.auth).send({ memoryMiB: 256 })).body.id as string;
    for (const [body, field] of [[{ cpu: 0 }, 'cpu'], [{ memoryMiB: 1.5 }, 'memoryMiB'], [{ diskGiB: 'big' }, 'diskGiB'], [{ memoryMiB: 10 }, 'memoryMiB']] as const) {
      const res = await patch(id, body);
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(JSON.stringify(res.body.error)).toContain(field);
    }
    await t.http.post(`${api}/${id}/pause`).set(t.auth);
    const paused = await patch(id, { memoryMiB: 512 });
    expect(paused.status).toBe(409);
    expect(paused.body.error.code).toBe('invalid_state');
    await t.http.delete(`${api}/${id}`).set(t.auth);
  }, 120_000);
});

// Daytona's warm pools (`daytona.warmPool`) through the real @daytonaio/sdk (issue 20): an
// organisation's pool of the default snapshot fills to `pool` (currentSize), a create of that
// snapshot at its size with nothing of its own is answered by a member (the fast path, counted
// in GET /api/v1/warm-pool), another organisation neither sees nor claims it, `pool: 0` drains,
// delete removes it; conflicts, 404s and bad input are the SDK's errors naming the field.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Daytona, DaytonaConflictError, DaytonaNotFoundError, Image, type Sandbox } from '@daytonaio/sdk';
import { waitFor } from '../../test/harness.js';
import { startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

let env: DaytonaTestEnv;
let other: Daytona;
let otherOrgId: string;
const CAP = 3;

beforeAll(async () => {
  env = await startDaytonaEnv({ NESTBOX_ORG_WARM_POOL_MAX: String(CAP), NESTBOX_DEFAULT_DISK_GIB: '1' });
  const org = await env.server.http.post('/api/v1/organizations').set(env.server.auth).send({ name: 'daytona-warm-pool-other' });
  otherOrgId = org.body.id;
  const key = await env.server.http.post(`/api/v1/organizations/${org.body.id}/api-keys`).set(env.server.auth).send({});
  other = new Daytona({ apiUrl: env.apiUrl, apiKey: key.body.key });
}, 180_000);
afterAll(async () => {
  await env?.server.close();
}, 120_000);

const db = () => env.server.server.db;
/** Ready members of one pool (what currentSize counts), by id. */
const membersOf = async (poolId: string) => ((await db()('warm_pool_sandboxes').where({ pool_id: poolId, state: 'ready' }).select('id')) as { id: string }[]).map((r) => r.id);
const hits = async () => ((await env.server.http.get('/api/v1/warm-pool').set(env.server.auth).expect(200)).body as { hits: number }).hits;
/** The organisation's sandboxes as the SDK lists them (a handful here: the iteration ends). */
const listedIds = async (d: Daytona) => {
  const ids: string[] = [];
  for await (const s of d.list()) ids.push(s.id);
  return ids;
};
const poolNamed = async (d: Daytona, id: string) => (await d.warmPool.list()).find((p) => p.id === id);

describe('daytona.warmPool', () => {
  let poolId: string;
  const created: Sandbox[] = [];

  it('refuses bad input naming the field, an unknown snapshot (404) and more than the organisation may keep warm', async () => {
    await expect(env.daytona.warmPool.create({ snapshot: 'default', pool: -1 })).rejects.toThrow(/pool/);
    await expect(env.daytona.warmPool.create({ snapshot: 'default', pool: 1.5 })).rejects.toThrow(/pool/);
    await expect(env.daytona.warmPool.create({ pool: 1 } as never)).rejects.toThrow(/snapshot/);
    await expect(env.daytona.warmPool.create({ snapshot: 'default', pool: CAP + 1 })).rejects.toThrow(/pool.*NESTBOX_ORG_WARM_POOL_MAX/);
    await expect(env.daytona.warmPool.create({ snapshot: 'default', pool: 1, target: 'eu' })).rejects.toThrow(/target/);
    await expect(env.daytona.warmPool.create({ snapshot: 'no-such-snapshot', pool: 1 })).rejects.toBeInstanceOf(DaytonaNotFoundError);
    expect(await env.daytona.warmPool.list()).toEqual([]);
  });

  it('creates a pool of the default snapshot that fills to `pool`; a second for the same snapshot and region conflicts', async () => {
    const pool = await env.daytona.warmPool.create({ snapshot: 'default', pool: 2 });
    poolId = pool.id;
    expect(pool).toMatchObject({ snapshot: 'default', pool: 2, target: 'local', osUser: 'daytona', env: {}, cpu: expect.any(Number), mem: expect.any(Number), disk: 1 });
    expect(pool.currentSize).toBeLessThanOrEqual(2);
    expect(typeof pool.organizationId).toBe('string');
    expect(Date.parse(pool.createdAt)).not.toBeNaN();
    await expect(env.daytona.warmPool.create({ snapshot: 'default', pool: 1 })).rejects.toBeInstanceOf(DaytonaConflictError);
    // The cap counts every pool of the organisation: 2 asked for, CAP - 2 left.
    await expect(env.daytona.warmPool.update(poolId, { pool: CAP + 1 })).rejects.toThrow(/pool/);
    const full = await waitFor('the pool at currentSize 2', async () => {
      const p = await poolNamed(env.daytona, poolId);
      return p?.currentSize === 2 ? p : undefined;
    }, 120_000, 200);
    expect(full.errorReason ?? null).toBeNull();
    // Members are nobody's sandboxes until claimed: not in the organisation's list.
    const listed = await listedIds(env.daytona);
    for (const id of await membersOf(poolId)) expect(listed).not.toContain(id);
  }, 180_000);

  it('another organisation neither sees, changes nor claims the pool, and keeps its own', async () => {
    expect(await other.warmPool.list()).toEqual([]);
    await expect(other.warmPool.update(poolId, { pool: 0 })).rejects.toBeInstanceOf(DaytonaNotFoundError);
    await expect(other.warmPool.delete(poolId)).rejects.toBeInstanceOf(DaytonaNotFoundError);
    const mine = await membersOf(poolId);
    const theirs = await other.warmPool.create({ snapshot: 'default', pool: 1 });
    await waitFor('the other organisation\'s pool full', async () => (await poolNamed(other, theirs.id))?.currentSize === 1, 120_000, 200);
    const theirMembers = await membersOf(theirs.id);
    const before = await hits();
    const sb = await other.create({ snapshot: 'default' });
    created.push(sb);
    // Its own member, not one of ours (ours are all still there).
    expect(theirMembers).toContain(sb.id);
    expect(mine).not.toContain(sb.id);
    expect(await membersOf(poolId)).toEqual(expect.arrayContaining(mine));
    expect(await hits()).toBe(before + 1);
    await other.warmPool.delete(theirs.id);
    await waitFor('the other organisation\'s members removed', async () => ((await db()('warm_pool_sandboxes').where({ pool_id: theirs.id })) as unknown[]).length === 0, 60_000, 200);
  }, 240_000);

  it('members count against no quota until claimed, and a claim is refused by the quota like any create (the member stays)', async () => {
    // The other organisation runs one sandbox (its claim above) and may run one: its pool still fills.
    expect((await env.server.http.patch(`/api/v1/organizations/${otherOrgId}`).set(env.server.auth).send({ limits: { maxSandboxes: 1 } })).status).toBe(200);
    const theirs = await other.warmPool.create({ snapshot: 'default', pool: 2 });
    await waitFor('the other organisation\'s pool full past its sandbox limit', async () => (await poolNamed(other, theirs.id))?.currentSize === 2, 120_000, 200);
    const members = await membersOf(theirs.id);
    await expect(other.create({ snapshot: 'default' })).rejects.toThrow(/limit|quota/i);
    expect((await membersOf(theirs.id)).sort()).toEqual([...members].sort());
    await other.warmPool.delete(theirs.id);
    await waitFor('the other organisation\'s members removed', async () => ((await db()('warm_pool_sandboxes').where({ pool_id: theirs.id })) as unknown[]).length === 0, 60_000, 200);
  }, 240_000);

  it('a create of the snapshot at its size is answered by a member; one with env of its own goes cold', async () => {
    const members = await membersOf(poolId);
    expect(members.length).toBe(2);
    const before = await hits();
    const sb = await env.daytona.create({ snapshot: 'default', labels: { via: 'pool' } });
    created.push(sb);
    expect(members).toContain(sb.id);
    expect(await hits()).toBe(before + 1);
    // Daytona sets warmPoolId "only while it is an unclaimed member": a claimed sandbox is an ordinary one.
    expect(sb.warmPoolId).toBeUndefined();
    expect(sb.labels).toMatchObject({ via: 'pool' });
    expect((await sb.process.executeCommand('echo warm')).result.trim()).toBe('warm');
    expect(await listedIds(env.daytona)).toContain(sb.id);

    const cold = await env.daytona.create({ snapshot: 'default', envVars: { MINE: '1' } });
    created.push(cold);
    expect(await membersOf(poolId)).not.toContain(cold.id);
    expect(members).not.toContain(cold.id);
    expect((await cold.process.executeCommand('printf %s "$MINE"')).result).toBe('1');
    // The pool refills what the claim took.
    await waitFor('the pool refilled', async () => (await poolNamed(env.daytona, poolId))?.currentSize === 2, 120_000, 200);
  }, 240_000);

  it('`pool: 0` drains the pool; delete removes it; then every call on it is a 404', async () => {
    const drained = await env.daytona.warmPool.update(poolId, { pool: 0 });
    expect(drained.pool).toBe(0);
    await waitFor('the pool drained', async () => ((await db()('warm_pool_sandboxes').where({ pool_id: poolId })) as unknown[]).length === 0 && (await poolNamed(env.daytona, poolId))?.currentSize === 0, 60_000, 200);
    // A create now goes cold (no member), and still works.
    const sb = await env.daytona.create({ snapshot: 'default' });
    created.push(sb);
    await env.daytona.warmPool.delete(poolId);
    expect(await env.daytona.warmPool.list()).toEqual([]);
    await expect(env.daytona.warmPool.update(poolId, { pool: 1 })).rejects.toBeInstanceOf(DaytonaNotFoundError);
    await expect(env.daytona.warmPool.delete(poolId)).rejects.toBeInstanceOf(DaytonaNotFoundError);
    for (const s of created) await s.delete();
  }, 180_000);

  it('a pool of a built snapshot: members start from its layers at its resources, and a claimed one has its files and env', async () => {
    const image = Image.base('default').runCommands('echo built > /built.txt').env({ GREETING: 'hello pool' });
    await env.daytona.snapshot.create({ name: 'pooled-img', image, resources: { cpu: 1, memory: 1, disk: 1 } });
    const pool = await env.daytona.warmPool.create({ snapshot: 'pooled-img', pool: 1 });
    expect(pool).toMatchObject({ snapshot: 'pooled-img', cpu: 1, mem: 1, disk: 1, pool: 1 });
    await waitFor('the built snapshot\'s pool full', async () => (await poolNamed(env.daytona, pool.id))?.currentSize === 1, 120_000, 200);
    const members = await membersOf(pool.id);
    const sb = await env.daytona.create({ snapshot: 'pooled-img' });
    expect(members).toContain(sb.id);
    expect((await sb.process.executeCommand('cat /built.txt')).result.trim()).toBe('built');
    expect((await sb.process.executeCommand('printf %s "$GREETING"')).result).toBe('hello pool');
    await env.daytona.warmPool.delete(pool.id);
    await sb.delete();
  }, 300_000);
});

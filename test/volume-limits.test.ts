// Per-organisation volume limits (issue 19 review): the operator sets an organisation's own
// maxVolumes, maxVolumeTotalGiB and maxVolumeSizeGiB (PATCH /organizations/{id}, `nestbox orgs
// limits`); volume creates enforce them over the server's NESTBOX_ORG_MAX_VOLUMES,
// NESTBOX_ORG_MAX_VOLUME_GIB and NESTBOX_VOLUME_MAX_MIB. An organisation with lower limits is
// refused naming the limit; another organisation keeps the defaults; bad values are 400 naming
// the field. Real server, PostgreSQL, the local driver (volumes that fit are really made).
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from './harness.js';
import { projectPath } from '../src/paths.js';

const GiB = 2 ** 30;
let t: TestServer;
let work: string;
let limited: { id: string; auth: { Authorization: string } };
let unlimited: { id: string; auth: { Authorization: string } };

async function organization(name: string): Promise<{ id: string; auth: { Authorization: string } }> {
  const org = await t.http.post('/api/v1/organizations').set(t.auth).send({ name });
  expect(org.status, JSON.stringify(org.body)).toBe(201);
  const key = await t.http.post(`/api/v1/organizations/${org.body.id}/api-keys`).set(t.auth).send({});
  return { id: org.body.id as string, auth: { Authorization: `Bearer ${key.body.key}` } };
}

/** The CLI as a user runs it (dist/), with the operator's key and a home of its own; bounded in time. */
function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: work, XDG_CONFIG_HOME: join(work, 'config'), NESTBOX_DATA_DIR: join(work, 'data'), NESTBOX_URL: t.url, NESTBOX_API_KEY: t.apiKey };
    execFile(process.execPath, [projectPath('dist/src/cli.js'), ...args], { env, timeout: 60_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? Number((error as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'nestbox-volume-limits-'));
  t = await startTestServer({ env: { NESTBOX_ORG_MAX_VOLUMES: '5', NESTBOX_ORG_MAX_VOLUME_GIB: '8', NESTBOX_VOLUME_DEFAULT_MIB: '2048', NESTBOX_VOLUME_MAX_MIB: '4096' } });
  limited = await organization('volume-limits-low');
  unlimited = await organization('volume-limits-default');
}, 180_000);

afterAll(async () => {
  if (work) rmSync(work, { recursive: true, force: true });
  if (!t) return;
  for (const org of [limited, unlimited]) {
    if (!org) continue;
    const volumes = await t.http.get('/api/v1/volumes').set(org.auth);
    for (const v of (volumes.body.items ?? []) as { id: string }[]) await t.http.delete(`/api/v1/volumes/${v.id}`).set(org.auth);
  }
  await t.close();
}, 180_000);

describe('per-organisation volume limits', () => {
  it('shows the defaults in force, then the own limits set through the CLI', async () => {
    const before = await t.http.get(`/api/v1/organizations/${limited.id}`).set(t.auth);
    expect(before.body.limits).toMatchObject({ maxVolumes: 5, maxVolumeTotalGiB: 8, maxVolumeSizeGiB: 4 });
    expect(before.body.customLimits).toMatchObject({ maxVolumes: null, maxVolumeTotalGiB: null, maxVolumeSizeGiB: null });
    const set = await cli(['--json', 'orgs', 'limits', limited.id, '--max-volumes', '2', '--max-volume-total-gib', '3', '--max-volume-size-gib', '1']);
    expect(set.code, set.stderr).toBe(0);
    expect(JSON.parse(set.stdout)).toMatchObject({ limits: { maxVolumes: 2, maxVolumeTotalGiB: 3, maxVolumeSizeGiB: 1 }, customLimits: { maxVolumes: 2, maxVolumeTotalGiB: 3, maxVolumeSizeGiB: 1 } });
    const table = await cli(['orgs', 'get', limited.id]);
    expect(table.stdout).toMatch(/maxVolumeSizeGiB\s+1\s+own/);
    const bad = await cli(['orgs', 'limits', limited.id, '--max-volumes', 'many']);
    expect(bad.code).not.toBe(0);
    expect(bad.stderr).toMatch(/--max-volumes/);
  }, 120_000);

  it('refuses the organisation over its own limits, naming each; another organisation keeps the defaults', async () => {
    // Largest volume 1 GiB: a 2 GiB one is a 400 naming sizeBytes and the organisation's limit.
    const tooLarge = await t.http.post('/api/v1/volumes').set(limited.auth).send({ name: 'large', sizeBytes: 2 * GiB });
    expect(tooLarge.status, JSON.stringify(tooLarge.body)).toBe(400);
    expect(tooLarge.body.error.message).toMatch(/^sizeBytes: .*maxVolumeSizeGiB is 1/);
    // No size given: the server's default (2 GiB) capped at the organisation's largest.
    const defaulted = await t.http.post('/api/v1/volumes').set(limited.auth).send({ name: 'first' });
    expect(defaulted.status, JSON.stringify(defaulted.body)).toBe(201);
    expect(defaulted.body.sizeBytes).toBe(GiB);
    const second = await t.http.post('/api/v1/volumes').set(limited.auth).send({ name: 'second', sizeBytes: GiB });
    expect(second.status, JSON.stringify(second.body)).toBe(201);
    // Count 2: the third is refused, naming the limit and what to raise.
    const third = await t.http.post('/api/v1/volumes').set(limited.auth).send({ name: 'third', sizeBytes: 64 * 2 ** 20 });
    expect(third.status).toBe(429);
    expect(third.body.error).toMatchObject({ code: 'quota_exceeded' });
    expect(third.body.error.message).toMatch(/2 of 2 volumes.*the organisation's maxVolumes/);
    // Total 3 GiB: with the count raised, 2 GiB in use + 2 GiB more is over it (the size must fit the largest too).
    expect((await t.http.patch(`/api/v1/organizations/${limited.id}`).set(t.auth).send({ limits: { maxVolumes: null, maxVolumeSizeGiB: 2 } })).status).toBe(200);
    const overTotal = await t.http.post('/api/v1/volumes').set(limited.auth).send({ name: 'third', sizeBytes: 2 * GiB });
    expect(overTotal.status).toBe(429);
    expect(overTotal.body.error.message).toMatch(/the organisation's maxVolumeTotalGiB/);

    // The other organisation: the server's defaults (largest 4 GiB, 8 GiB in all).
    const big = await t.http.post('/api/v1/volumes').set(unlimited.auth).send({ name: 'large', sizeBytes: 4 * GiB });
    expect(big.status, JSON.stringify(big.body)).toBe(201);
    const plain = await t.http.post('/api/v1/volumes').set(unlimited.auth).send({ name: 'plain' });
    expect(plain.status, JSON.stringify(plain.body)).toBe(201);
    expect(plain.body.sizeBytes).toBe(2 * GiB);
    const overDefault = await t.http.post('/api/v1/volumes').set(unlimited.auth).send({ name: 'more', sizeBytes: 3 * GiB });
    expect(overDefault.status).toBe(429);
    expect(overDefault.body.error.message).toMatch(/NESTBOX_ORG_MAX_VOLUME_GIB/);
  }, 300_000);

  it('bad values are a 400 naming the field', async () => {
    for (const [limits, field] of [
      [{ maxVolumes: -1 }, 'limits.maxVolumes'],
      [{ maxVolumes: 1.5 }, 'limits.maxVolumes'],
      [{ maxVolumeTotalGiB: 'lots' }, 'limits.maxVolumeTotalGiB'],
      [{ maxVolumeTotalGiB: 2_000_000 }, 'limits.maxVolumeTotalGiB'],
      [{ maxVolumeSizeGiB: 0 }, 'limits.maxVolumeSizeGiB'],
    ] as const) {
      const res = await t.http.patch(`/api/v1/organizations/${limited.id}`).set(t.auth).send({ limits });
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      expect(res.body.error.message).toContain(field);
    }
  });
});

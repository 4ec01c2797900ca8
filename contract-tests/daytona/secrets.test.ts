// Organisation secrets and runtime env changes through the real @daytonaio/sdk (issue 19):
// `daytona.secret.*` never returns a value, `create({secrets})` and `updateSecrets` give a
// sandbox secrets as env variables (the value itself: Nestbox has no egress proxy swapping
// placeholders), `sandbox.updateEnv` changes what later commands and sessions see and survives a
// stop/start, and no SDK answer or server log line holds a secret value.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DaytonaError, type Sandbox } from '@daytonaio/sdk';
import { startDaytonaEnv, rawFetch, type DaytonaTestEnv } from './helpers.js';

let env: DaytonaTestEnv;
const VALUE = `dtn-${Math.random().toString(36).slice(2)}-value`;
const OTHER = `dtn-${Math.random().toString(36).slice(2)}-other`;

beforeAll(async () => {
  env = await startDaytonaEnv({ NESTBOX_LOG_LEVEL: 'debug' });
}, 180_000);
afterAll(async () => {
  await env?.server.close();
}, 120_000);

const out = async (sb: Sandbox, cmd: string) => (await sb.process.executeCommand(cmd)).result;

describe('daytona.secret', () => {
  let sb: Sandbox;
  let id: string;

  it('creates, gets, lists, updates and deletes secrets without ever returning a value', async () => {
    const created = await env.daytona.secret.create({ name: 'API_KEY_SECRET', value: VALUE, description: 'the api key', hosts: ['api.example.com'] });
    id = created.id;
    expect(created).toMatchObject({ name: 'API_KEY_SECRET', description: 'the api key', hosts: ['api.example.com'], placeholder: `dtn_secret_${created.id}` });
    expect(JSON.stringify(created)).not.toContain(VALUE);
    expect(await env.daytona.secret.get(id)).toMatchObject({ id, name: 'API_KEY_SECRET' });
    const other = await env.daytona.secret.create({ name: 'other-secret', value: OTHER });
    const page = await env.daytona.secret.list({ limit: 1, sort: 'name', order: 'asc' });
    expect(page.total).toBe(2);
    expect(page.items.map((s) => s.name)).toEqual(['API_KEY_SECRET']);
    const next = await env.daytona.secret.list({ limit: 1, sort: 'name', order: 'asc', cursor: page.nextCursor! });
    expect(next.items.map((s) => s.name)).toEqual(['other-secret']);
    expect(next.nextCursor).toBeNull();
    expect((await env.daytona.secret.list({ name: 'other' })).items.map((s) => s.id)).toEqual([other.id]);
    expect(JSON.stringify([page, next])).not.toContain(VALUE);

    const updated = await env.daytona.secret.update(other.id, { description: 'changed', hosts: ['*.example.com'] });
    expect(updated).toMatchObject({ description: 'changed', hosts: ['*.example.com'] });
    await expect(env.daytona.secret.create({ name: 'API_KEY_SECRET', value: 'x' })).rejects.toThrow(DaytonaError);
    await expect(env.daytona.secret.create({ name: 'bad name', value: 'x' })).rejects.toThrow(/name/);
    await env.daytona.secret.delete(other.id);
    await expect(env.daytona.secret.get(other.id)).rejects.toThrow(/not found/i);
  });

  it('gives secrets as env at create and through updateSecrets', async () => {
    await expect(env.daytona.create({ secrets: { X: 'no-such-secret' } })).rejects.toThrow(/secrets\[0\]\.name/);
    sb = await env.daytona.create({ secrets: { API_KEY: 'API_KEY_SECRET' }, envVars: { PLAIN: 'p' } });
    expect(await out(sb, 'printf %s "$API_KEY"')).toBe(VALUE);
    expect(JSON.stringify(sb.env)).not.toContain(VALUE);
    expect(sb.env).toEqual({ PLAIN: 'p' });

    // A second name for it, the old one detached: later commands see the change at once.
    await sb.updateSecrets({ SECOND: 'API_KEY_SECRET' });
    expect(sb.id).toBeTruthy();
    expect(await out(sb, 'printf "%s|%s" "${API_KEY-unset}" "$SECOND"')).toBe(`unset|${VALUE}`);
    await expect(sb.updateSecrets({ Y: 'no-such-secret' })).rejects.toThrow(/no secret named/);

    // A new value reaches the sandbox at its next start.
    await env.daytona.secret.update(id, { value: OTHER });
    expect(await out(sb, 'printf %s "$SECOND"')).toBe(VALUE);
    await sb.stop();
    await sb.start();
    expect(await out(sb, 'printf %s "$SECOND"')).toBe(OTHER);

    await sb.updateSecrets({});
    expect(await out(sb, 'printf %s "${SECOND-unset}"')).toBe('unset');
  });

  it('updateEnv changes what later commands and sessions see, unset first, and survives a stop/start', async () => {
    await sb.updateEnv({ NODE_ENV: 'production', PLAIN: 'p2' });
    expect(await out(sb, 'printf "%s|%s" "$NODE_ENV" "$PLAIN"')).toBe('production|p2');
    await sb.updateEnv({ ADDED: 'a' }, { unset: ['NODE_ENV'] });
    await sb.process.createSession('s1');
    const inSession = await sb.process.executeSessionCommand('s1', { command: 'printf "%s|%s|%s" "${NODE_ENV-unset}" "$ADDED" "$PLAIN"' });
    expect(inSession.output ?? inSession.stdout).toContain('unset|a|p2');
    await sb.stop();
    await sb.start();
    expect(await out(sb, 'printf "%s|%s|%s" "${NODE_ENV-unset}" "$ADDED" "$PLAIN"')).toBe('unset|a|p2');
    await sb.refreshData();
    expect(sb.env).toEqual({ PLAIN: 'p2', ADDED: 'a' });
    await expect(sb.updateEnv({ 'BAD-NAME': 'x' })).rejects.toThrow(/set\.BAD-NAME/);
    await expect(sb.updateEnv({}, { unset: ['1X'] })).rejects.toThrow(/unset\[0\]/);
  });

  it('never puts a secret value in an answer or a log line', async () => {
    const raw = await rawFetch(env, `/daytona/api/sandbox/${sb.id}`);
    expect(await raw.text()).not.toContain(VALUE);
    const logs = env.server.logs.join('\n');
    expect(logs.length).toBeGreaterThan(1000);
    expect(logs).not.toContain(VALUE);
    expect(logs).not.toContain(OTHER);
    await sb.delete();
  });
});

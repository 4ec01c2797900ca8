// E2B's Secret module through the real e2b SDK (issue 19): create, update (a new version),
// getInfo by id and by name, list (paginated), exists, destroy; values never in an answer or a
// server log line; `Secret.fill(name)` as an envVars value gives the sandbox that secret as the
// variable (Nestbox resolves it at every start; E2B's own egress-proxy substitution in network
// rules is not there), and the sandbox's info does not show it.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox, Secret, SecretNotFoundError } from 'e2b';
import { startE2bTestServer, type E2bTestServer } from './helpers.js';

let t: E2bTestServer;
const VALUE = `e2b-${Math.random().toString(36).slice(2)}-value`;
const NEXT = `e2b-${Math.random().toString(36).slice(2)}-next`;

beforeAll(async () => {
  t = await startE2bTestServer({ NESTBOX_LOG_LEVEL: 'debug' });
}, 180_000);
afterAll(async () => {
  await t?.close();
}, 120_000);

describe('E2B secrets', () => {
  it('are created, versioned, read by id or name, listed page by page and destroyed, never showing a value', async () => {
    const created = await Secret.create('OpenAI-API-Key', VALUE, { ...t.opts, metadata: { team: 'ml' } });
    expect(created).toMatchObject({ name: 'openai-api-key', version: 1, metadata: { team: 'ml' } });
    expect(created.secretId).toMatch(/^sec/);
    expect(await Secret.getInfo('openai-api-key', t.opts)).toMatchObject({ secretId: created.secretId, version: 1 });
    const updated = await Secret.update(created.secretId, NEXT, t.opts);
    expect(updated.version).toBe(2);
    expect(updated.metadata).toEqual({ team: 'ml' });
    for (let i = 0; i < 3; i++) await Secret.create(`extra-${i}`, 'x', t.opts);
    const paginator = Secret.list({ ...t.opts, limit: 2 });
    const names: string[] = [];
    let pages = 0;
    while (paginator.hasNext) {
      names.push(...(await paginator.nextItems()).map((s) => s.name));
      pages++;
    }
    expect(pages).toBe(2);
    expect(names.sort()).toEqual(['extra-0', 'extra-1', 'extra-2', 'openai-api-key']);
    expect(await Secret.exists('extra-1', t.opts)).toBe(true);
    expect(await Secret.destroy('extra-1', t.opts)).toBe(true);
    expect(await Secret.destroy('extra-1', t.opts)).toBe(false);
    expect(await Secret.exists('extra-1', t.opts)).toBe(false);
    await expect(Secret.getInfo('extra-1', t.opts)).rejects.toThrow(SecretNotFoundError);
    await expect(Secret.update('nope', 'x', t.opts)).rejects.toThrow(SecretNotFoundError);
    await expect(Secret.create('openai-api-key', 'x', t.opts)).rejects.toThrow(/already exists/);
    expect(JSON.stringify([created, updated])).not.toContain(VALUE);
  });

  it('reach a sandbox as env through Secret.fill, and never its info or the logs', async () => {
    await expect(Sandbox.create({ ...t.opts, envs: { X: Secret.fill('no-such-secret') } })).rejects.toThrow(/no secret named/);
    const sbx = await Sandbox.create({ ...t.opts, envs: { OPENAI_API_KEY: Secret.fill('openai-api-key'), PLAIN: 'p' } });
    try {
      expect((await sbx.commands.run('printf "%s|%s" "$OPENAI_API_KEY" "$PLAIN"')).stdout).toBe(`${NEXT}|p`);
      const info = await sbx.getInfo();
      expect(JSON.stringify(info)).not.toContain(NEXT);
      const raw = await fetch(`${t.url}/e2b/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-Key': t.apiKey } });
      expect(await raw.text()).not.toContain(NEXT);
    } finally {
      await sbx.kill();
    }
    const logs = t.logs.join('\n');
    expect(logs.length).toBeGreaterThan(1000);
    expect(logs).not.toContain(VALUE);
    expect(logs).not.toContain(NEXT);
  });
});

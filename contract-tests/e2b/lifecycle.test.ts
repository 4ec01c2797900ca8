// Sandbox lifecycle through the real `e2b` SDK (latest): create, getInfo, list, setTimeout,
// pause, connect (resume), kill, and the error classes of e2b.md (f).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AuthenticationError, Sandbox, SandboxError, SandboxNotFoundError } from 'e2b';
import { sleep, startE2bTestServer, type E2bTestServer } from './helpers.js';

let t: E2bTestServer;

beforeAll(async () => {
  t = await startE2bTestServer();
});

afterAll(async () => {
  await t?.close();
});

describe('e2b Sandbox lifecycle', () => {
  it('creates a sandbox with metadata and envs, and reports it through getInfo and list', async () => {
    const sbx = await Sandbox.create({ ...t.opts, metadata: { suite: 'lifecycle', who: 'a b&c' }, envs: { GREETING: 'hello' }, timeoutMs: 120_000 });
    expect(sbx.sandboxId).toMatch(/^[a-z0-9]+$/);
    const info = await sbx.getInfo();
    expect(info.sandboxId).toBe(sbx.sandboxId);
    expect(info.state).toBe('running');
    expect(info.metadata).toEqual({ suite: 'lifecycle', who: 'a b&c' });
    expect(info.templateId).toBe('base');
    expect(info.endAt.getTime() - Date.now()).toBeGreaterThan(60_000);
    expect(info.endAt.getTime() - Date.now()).toBeLessThanOrEqual(120_000);

    const env = await sbx.commands.run('echo $GREETING');
    expect(env.stdout.trim()).toBe('hello');

    // The metadata filter is encoded three times on the wire (e2b.md (b)); a value with & and space must still match.
    const page = Sandbox.list({ ...t.opts, query: { metadata: { who: 'a b&c' } } });
    const items = await page.nextItems();
    expect(items.map((s) => s.sandboxId)).toEqual([sbx.sandboxId]);
    expect(items[0].state).toBe('running');
    const none = await Sandbox.list({ ...t.opts, query: { metadata: { who: 'nobody' } } }).nextItems();
    expect(none).toEqual([]);

    expect(await sbx.isRunning()).toBe(true);
    await sbx.setTimeout(30_000);
    const later = await Sandbox.getInfo(sbx.sandboxId, t.opts);
    expect(later.endAt.getTime() - Date.now()).toBeLessThanOrEqual(30_000);
    expect(later.endAt.getTime() - Date.now()).toBeGreaterThan(10_000);

    expect(await sbx.kill()).toBe(true);
    expect(await Sandbox.kill(sbx.sandboxId, t.opts)).toBe(false);
    await expect(Sandbox.getInfo(sbx.sandboxId, t.opts)).rejects.toBeInstanceOf(SandboxNotFoundError);
  });

  it('pages through list with x-next-token and filters by state', async () => {
    const a = await Sandbox.create({ ...t.opts, metadata: { suite: 'paging' } });
    const b = await Sandbox.create({ ...t.opts, metadata: { suite: 'paging' } });
    const paginator = Sandbox.list({ ...t.opts, limit: 1, query: { metadata: { suite: 'paging' } } });
    const seen: string[] = [];
    while (paginator.hasNext) {
      const items = await paginator.nextItems();
      expect(items.length).toBeLessThanOrEqual(1);
      seen.push(...items.map((s) => s.sandboxId));
    }
    expect(seen.sort()).toEqual([a.sandboxId, b.sandboxId].sort());

    expect(await b.pause()).toBe(true);
    // Pausing again: body code 409 → false (e2b.md (f)).
    expect(await b.pause()).toBe(false);
    const paused = await Sandbox.list({ ...t.opts, query: { metadata: { suite: 'paging' }, state: ['paused'] } }).nextItems();
    expect(paused.map((s) => s.sandboxId)).toEqual([b.sandboxId]);
    expect(paused[0].state).toBe('paused');
    const running = await Sandbox.list({ ...t.opts, query: { metadata: { suite: 'paging' }, state: ['running'] } }).nextItems();
    expect(running.map((s) => s.sandboxId)).toEqual([a.sandboxId]);
    await a.kill();
    await b.kill();
  });

  it('lists in start order (order asc/desc across pages), from startedAfter, by template', async () => {
    const suite = { suite: `order-${Date.now()}` };
    const first = await Sandbox.create({ ...t.opts, metadata: suite });
    await sleep(20);
    const between = new Date();
    await sleep(20);
    const second = await Sandbox.create({ ...t.opts, metadata: suite });
    const third = await Sandbox.create({ ...t.opts, metadata: suite });
    const all = async (opts: Parameters<typeof Sandbox.list>[0]) => {
      const paginator = Sandbox.list({ ...t.opts, ...opts });
      const ids: string[] = [];
      for (let i = 0; i < 20 && paginator.hasNext; i++) ids.push(...(await paginator.nextItems()).map((s) => s.sandboxId));
      return ids;
    };
    const newestFirst = [third.sandboxId, second.sandboxId, first.sandboxId];
    expect(await all({ query: { metadata: suite } })).toEqual(newestFirst);
    // The order holds across the whole result, page by page.
    expect(await all({ query: { metadata: suite }, order: 'asc', limit: 1 })).toEqual([...newestFirst].reverse());
    expect(await all({ query: { metadata: suite }, order: 'desc', limit: 2 })).toEqual(newestFirst);
    expect(await all({ query: { metadata: suite, startedAfter: between }, order: 'asc' })).toEqual([second.sandboxId, third.sandboxId]);

    // A template is a snapshot name; the default templates are the image.
    const snapshot = await second.createSnapshot({ name: `tpl-${Date.now()}` });
    const fromTemplate = await Sandbox.create(snapshot.snapshotId, { ...t.opts, metadata: suite });
    expect(await all({ query: { metadata: suite, template: snapshot.snapshotId } })).toEqual([fromTemplate.sandboxId]);
    expect((await all({ query: { metadata: suite, template: 'base' } })).sort()).toEqual([...newestFirst].sort());
    expect(await all({ query: { metadata: suite, template: 'no-such-template' } })).toEqual([]);
    const bad = await fetch(`${t.opts.apiUrl}/v2/sandboxes?order=sideways`, { headers: { 'X-API-KEY': t.apiKey } });
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ code: 400, message: 'order: must be "asc" or "desc"' });

    // Sandbox.listSnapshots pages with limit and x-next-token too.
    const other = await second.createSnapshot({ name: `tpl2-${Date.now()}` });
    const paginator = Sandbox.listSnapshots({ ...t.opts, sandboxId: second.sandboxId, limit: 1 });
    const names: string[] = [];
    for (let i = 0; i < 10 && paginator.hasNext; i++) {
      const page = await paginator.nextItems();
      expect(page.length).toBeLessThanOrEqual(1);
      names.push(...page.map((s) => s.snapshotId));
    }
    expect(names).toEqual([other.snapshotId, snapshot.snapshotId]);
    for (const s of [first, second, third, fromTemplate]) await s.kill();
    await Sandbox.deleteSnapshot(other.snapshotId, t.opts);
    await Sandbox.deleteSnapshot(snapshot.snapshotId, t.opts);
  });

  it('pause keeps processes and memory; connect resumes', async () => {
    const sbx = await Sandbox.create(t.opts);
    const bg = await sbx.commands.run('sleep 600', { background: true });
    await sbx.files.write('/tmp/state.txt', 'kept');
    expect(await sbx.pause()).toBe(true);
    expect((await sbx.getInfo()).state).toBe('paused');

    const again = await Sandbox.connect(sbx.sandboxId, t.opts);
    expect((await again.getInfo()).state).toBe('running');
    expect(await again.files.read('/tmp/state.txt')).toBe('kept');
    // The background process survived the pause (memory kept).
    const procs = await again.commands.list();
    expect(procs.map((p) => p.pid)).toContain(bg.pid);
    await again.kill();
  });

  it('connect to a running sandbox returns a working handle', async () => {
    const sbx = await Sandbox.create(t.opts);
    const other = await Sandbox.connect(sbx.sandboxId, t.opts);
    expect(other.sandboxId).toBe(sbx.sandboxId);
    expect((await other.commands.run('echo connected')).stdout).toBe('connected\n');
    await sbx.kill();
  });

  it('kills a sandbox at its timeout by default, as E2B does', async () => {
    const sbx = await Sandbox.create({ ...t.opts, timeoutMs: 2_000 });
    let gone = false;
    for (let i = 0; i < 60 && !gone; i++) {
      await sleep(250);
      gone = await Sandbox.getInfo(sbx.sandboxId, t.opts).then(() => false, (e: unknown) => e instanceof SandboxNotFoundError);
    }
    expect(gone).toBe(true);
    expect(await sbx.isRunning()).toBe(false);
  });

  it('keeps a sandbox with lifecycle onTimeout "pause" and resumes it from its disk', async () => {
    const sbx = await Sandbox.create({ ...t.opts, timeoutMs: 2_000, lifecycle: { onTimeout: 'pause' } });
    await sbx.files.write('/tmp/kept.txt', 'disk survives');
    let state = 'running';
    for (let i = 0; i < 60 && state !== 'paused'; i++) {
      await sleep(250);
      state = (await sbx.getInfo()).state;
    }
    expect(state).toBe('paused');
    const resumed = await Sandbox.connect(sbx.sandboxId, { ...t.opts, timeoutMs: 60_000 });
    expect(await resumed.files.read('/tmp/kept.txt')).toBe('disk survives');
    // Nestbox says what a resume restored: this one came back from its disk, not its memory.
    const detail = (await (await fetch(`${t.opts.apiUrl}/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-KEY': t.apiKey } })).json()) as { state: string; memoryRestored: boolean };
    expect(detail).toMatchObject({ state: 'running', memoryRestored: false });
    await resumed.kill();
  });

  it('maps errors onto the SDK classes', async () => {
    await expect(Sandbox.create({ ...t.opts, apiKey: 'nbx_' + 'x'.repeat(40) })).rejects.toBeInstanceOf(AuthenticationError);
    await expect(Sandbox.connect('doesnotexist0000', t.opts)).rejects.toBeInstanceOf(SandboxNotFoundError);
    await expect(Sandbox.setTimeout('doesnotexist0000', 10_000, t.opts)).rejects.toBeInstanceOf(SandboxNotFoundError);
    // An unknown template is a clear error, not a silent default.
    const err = await Sandbox.create('no-such-template', t.opts).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SandboxError);
    expect(String((err as Error).message)).toMatch(/template no-such-template not found/);
  });

  it('maps allowInternetAccess and updateNetwork onto the egress policy', async () => {
    const sbx = await Sandbox.create({ ...t.opts, allowInternetAccess: false, timeoutMs: 120_000 });
    const egressOf = async () => (await t.http.get(`/api/v1/sandboxes/${sbx.sandboxId}`).set(t.auth)).body.egress;
    expect(await egressOf()).toEqual({ mode: 'deny-all' });
    await sbx.updateNetwork({ allowOut: ['203.0.113.0/24'], denyOut: ['0.0.0.0/0'] });
    expect(await egressOf()).toEqual({ mode: 'allow-list', allow: ['203.0.113.0/24'] });
    await sbx.updateNetwork({ allowInternetAccess: true });
    expect(await egressOf()).toEqual({ mode: 'allow-all' });
    // Deny lists (and allow beating deny) are pinned in network.test.ts.
    await sbx.updateNetwork({ denyOut: ['10.0.0.0/8'] });
    expect(await egressOf()).toEqual({ mode: 'allow-all', deny: ['10.0.0.0/8'] });
    await sbx.kill();
  });
});

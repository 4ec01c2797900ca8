// Sandbox logs (e2b-wave2.md §4.2) through the real `e2b` SDK's generated API client (the
// high-level SDK calls no logs route): what the platform did to the sandbox, from core's
// lifecycle events, in both the deprecated and the v2 shapes.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiClient, ConnectionConfig, Sandbox } from 'e2b';
import { startE2bTestServer, type E2bTestServer } from './helpers.js';

let t: E2bTestServer;
let api: ApiClient['api'];

beforeAll(async () => {
  t = await startE2bTestServer();
  api = new ApiClient(new ConnectionConfig({ apiKey: t.opts.apiKey, apiUrl: t.opts.apiUrl })).api;
});
afterAll(async () => {
  await t?.close();
});

describe('e2b sandbox logs', () => {
  it('lists the lifecycle of a sandbox (created, paused, resumed) with timestamps and levels', async () => {
    const sbx = await Sandbox.create({ ...t.opts, timeoutMs: 120_000 });
    const started = Date.now();
    expect(await sbx.pause()).toBe(true);
    await Sandbox.connect(sbx.sandboxId, t.opts);

    const v1 = await api.GET('/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: sbx.sandboxId }, query: { start: started - 60_000, limit: 100 } } });
    expect(v1.response.status, JSON.stringify(v1.error)).toBe(200);
    const types = v1.data!.logEntries.map((e) => e.fields.type);
    expect(types).toEqual(['sandbox.creating', 'sandbox.created', 'sandbox.pausing', 'sandbox.paused', 'sandbox.resuming', 'sandbox.resumed']);
    expect(v1.data!.logs.map((l) => l.line)).toEqual(v1.data!.logEntries.map((e) => e.message));
    for (const e of v1.data!.logEntries) {
      expect(e.level).toBe('info');
      expect(Number.isNaN(Date.parse(String(e.timestamp)))).toBe(false);
    }
    // `start` is a lower bound in milliseconds.
    const later = await api.GET('/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: sbx.sandboxId }, query: { start: Date.now() + 60_000 } } });
    expect(later.data!.logEntries).toEqual([]);

    const back = await api.GET('/v2/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: sbx.sandboxId }, query: { direction: 'backward', limit: 2 } } });
    expect(back.response.status, JSON.stringify(back.error)).toBe(200);
    expect(back.data!.logs.map((e) => e.fields.type)).toEqual(['sandbox.resumed', 'sandbox.resuming']);
    const forward = await api.GET('/v2/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: sbx.sandboxId }, query: { cursor: started - 60_000, direction: 'forward', search: 'sandbox paused' } } });
    expect(forward.data!.logs.map((e) => e.fields.type)).toEqual(['sandbox.paused']);
    const errorsOnly = await api.GET('/v2/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: sbx.sandboxId }, query: { level: 'error' } } });
    expect(errorsOnly.data!.logs).toEqual([]);

    const bad = await api.GET('/v2/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: sbx.sandboxId }, query: { limit: 5000 } } });
    expect(bad.response.status).toBe(400);
    expect((bad.error as { message: string }).message).toMatch(/^limit\b/);
    const missing = await api.GET('/v2/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: 'nosuchsandbox0000000' } } });
    expect(missing.response.status).toBe(404);
    await sbx.kill();
  });

  it('a sandbox killed at its timeout logs timed_out (a warning), still readable after it is gone', async () => {
    const sbx = await Sandbox.create({ ...t.opts, timeoutMs: 1000 });
    const deadline = Date.now() + 60_000;
    let types: string[] = [];
    while (Date.now() < deadline) {
      const res = await api.GET('/v2/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: sbx.sandboxId } } });
      types = (res.data?.logs ?? []).map((e) => e.fields.type!);
      if (types.includes('sandbox.timed_out')) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(types).toEqual(['sandbox.creating', 'sandbox.created', 'sandbox.deleting', 'sandbox.timed_out']);
    const warn = await api.GET('/v2/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: sbx.sandboxId }, query: { level: 'warn' } } });
    expect(warn.data!.logs.map((e) => [e.level, e.fields.reason])).toEqual([['warn', 'timeout']]);
  });
});

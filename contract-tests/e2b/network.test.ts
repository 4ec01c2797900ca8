// Egress rules through the real `e2b` SDK (e2b-wave2.md §6): allowOut / denyOut on create and
// in updateNetwork, with E2B's semantics (allow beats deny; denyOut ALL_TRAFFIC plus allowOut is
// an allow list), enforced against a test "internet" namespace this file creates, read back by
// getInfo, and the SDK's errors for what upstream refuses.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ALL_TRAFFIC, Sandbox, SandboxError } from 'e2b';
import { createTestInternet, TCP_PROBE, type TestInternet } from '../../test/test-internet.js';
import { startE2bTestServer, type E2bTestServer } from './helpers.js';

let t: E2bTestServer;
let inet: TestInternet;
let api: string; // an address the allow lists name
let ads: string; // its neighbour in the same range

beforeAll(async () => {
  inet = await createTestInternet({ linkNet: 60, routedNet: 61, hosts: [10, 20], port: 47180 });
  [api, ads] = inet.routed;
  t = await startE2bTestServer();
}, 180_000);

afterAll(async () => {
  await t?.close();
  inet?.close();
}, 120_000);

async function reach(sbx: Sandbox, address: string): Promise<string> {
  const result = await sbx.commands.run(`python3 -c "$PROBE" ${address} ${inet.port}`, { envs: { PROBE: TCP_PROBE }, timeoutMs: 30_000 });
  return result.stdout.trim();
}

const egressOf = async (id: string) => (await t.http.get(`/api/v1/sandboxes/${id}`).set(t.auth)).body.egress;

describe('e2b network egress rules', () => {
  it('denies a denyOut address while allowOut exceptions and everything else stay reachable', async () => {
    const sbx = await Sandbox.create({ ...t.opts, timeoutMs: 300_000, network: { allowOut: [api], denyOut: [inet.routedRange] } });
    try {
      expect(await reach(sbx, api)).toBe('ok'); // allowOut beats denyOut
      expect(await reach(sbx, ads)).toBe('timeout');
      expect(await reach(sbx, inet.linkAddress)).toBe('ok');
      // Core got the deny list with the exception cut out (deny wins there).
      const egress = await egressOf(sbx.sandboxId);
      expect(egress).toEqual({
        mode: 'allow-all',
        deny: ['198.18.61.0/29', '198.18.61.8/31', '198.18.61.11', '198.18.61.12/30', '198.18.61.16/28', '198.18.61.32/27', '198.18.61.64/26', '198.18.61.128/25'],
      });
      const info = await sbx.getInfo();
      expect(info.network?.denyOut).toEqual(egress.deny);
      expect(info.network?.allowOut).toBeUndefined();

      // updateNetwork replaces the whole configuration.
      await sbx.updateNetwork({ denyOut: [inet.linkAddress] });
      expect(await reach(sbx, inet.linkAddress)).toBe('timeout');
      expect(await reach(sbx, ads)).toBe('ok');
      expect((await sbx.getInfo()).network?.denyOut).toEqual([inet.linkAddress]);
      await sbx.updateNetwork({});
      expect(await reach(sbx, inet.linkAddress)).toBe('ok');
      expect(await egressOf(sbx.sandboxId)).toEqual({ mode: 'allow-all' });
    } finally {
      await sbx.kill();
    }
  });

  it('makes denyOut ALL_TRAFFIC with allowOut an allow list, and allowInternetAccess false the same', async () => {
    const sbx = await Sandbox.create({ ...t.opts, timeoutMs: 300_000, network: { allowOut: [api], denyOut: ({ allTraffic }) => [allTraffic] } });
    try {
      expect(await egressOf(sbx.sandboxId)).toEqual({ mode: 'allow-list', allow: [api] });
      expect(await reach(sbx, api)).toBe('ok');
      expect(await reach(sbx, ads)).toBe('timeout');
      expect(await reach(sbx, inet.linkAddress)).toBe('timeout');
      const info = await sbx.getInfo();
      expect(info.network).toMatchObject({ allowOut: [api], denyOut: [ALL_TRAFFIC] });

      await sbx.updateNetwork({ allowOut: [ads], allowInternetAccess: false });
      expect(await egressOf(sbx.sandboxId)).toEqual({ mode: 'allow-list', allow: [ads] });
      expect(await reach(sbx, ads)).toBe('ok');
      expect(await reach(sbx, api)).toBe('timeout');
      await sbx.updateNetwork({ denyOut: [ALL_TRAFFIC] });
      expect(await egressOf(sbx.sandboxId)).toEqual({ mode: 'deny-all' });
      expect(await reach(sbx, ads)).toBe('timeout');
      expect((await sbx.getInfo()).allowInternetAccess).toBe(false);
    } finally {
      await sbx.kill();
    }
  });

  it('answers what upstream refuses with the SDK error naming the field', async () => {
    const refused = async (network: Record<string, unknown>) => {
      const error = await Sandbox.create({ ...t.opts, network }).then(
        async (sbx) => {
          await sbx.kill();
          return undefined;
        },
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(SandboxError);
      return String((error as Error).message);
    };
    expect(await refused({ denyOut: ['198.18.61.0/33'] })).toMatch(/^400: network\.denyOut\[0\]: .*198\.18\.61\.0\/33/);
    expect(await refused({ denyOut: [inet.linkAddress, 'example.com'] })).toMatch(/^400: network\.denyOut\[1\]: invalid denied CIDR example\.com/);
    expect(await refused({ allowOut: ['api.example.com'] })).toMatch(/^400: network\.allowOut: When specifying allowed domains in allow out, you must include 'ALL_TRAFFIC' in deny out/);
    expect(await refused({ allowOut: ['not a host'], denyOut: [ALL_TRAFFIC] })).toMatch(/^400: network\.allowOut\[0\]:/);
    expect(await refused({ allowOut: ['*.example.com'], denyOut: [ALL_TRAFFIC] })).toMatch(/^400: network\.allowOut\[0\]: .*wildcard/);
    expect(await refused({ maskRequestHost: 'custom.example.com:${PORT}' })).toMatch(/^501: network\.maskRequestHost/);
    // Python's dnsServers (JS 2.51 has no such option, hence the raw request): with a domain in
    // allowOut, the resolvers named are allowed too; an entry that is no address is a 400.
    const raw = (network: Record<string, unknown>) => fetch(`${t.opts.apiUrl}/v2/sandboxes`, { method: 'POST', headers: { 'X-API-KEY': t.apiKey, 'content-type': 'application/json' }, body: JSON.stringify({ templateID: 'base', timeout: 60, network }) });
    const badDns = await raw({ allowOut: ['localhost'], denyOut: [ALL_TRAFFIC], dnsServers: ['resolver.example'] });
    expect(badDns.status).toBe(400);
    expect(((await badDns.json()) as { message: string }).message).toMatch(/^network\.dnsServers\[0\]:/);
    const withDns = await raw({ allowOut: ['localhost'], denyOut: [ALL_TRAFFIC], dnsServers: [api] });
    expect(withDns.status).toBe(201);
    const dnsId = ((await withDns.json()) as { sandboxID: string }).sandboxID;
    expect(await egressOf(dnsId)).toEqual({ mode: 'allow-list', allow: ['localhost', api] });
    await Sandbox.kill(dnsId, t.opts);
    // updateNetwork: the same checks, fields at the top level.
    const sbx = await Sandbox.create({ ...t.opts, timeoutMs: 120_000, network: { denyOut: [ALL_TRAFFIC] } });
    try {
      await expect(sbx.updateNetwork({ denyOut: ['example.com'] })).rejects.toThrow(/400: denyOut\[0\]: invalid denied CIDR example\.com/);
      expect(await egressOf(sbx.sandboxId)).toEqual({ mode: 'deny-all' });
    } finally {
      await sbx.kill();
    }
  });
});

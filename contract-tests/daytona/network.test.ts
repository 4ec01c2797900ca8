// Network settings through the real @daytonaio/sdk: networkBlockAll / networkAllowList /
// domainAllowList on create and in updateNetworkSettings, enforced against a test "internet"
// namespace this file creates, and reported in the sandbox DTO as what is in force.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DaytonaError, type Sandbox } from '@daytonaio/sdk';
import { createTestInternet, TCP_PROBE, type TestInternet } from '../../test/test-internet.js';
import { startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

let env: DaytonaTestEnv;
let inet: TestInternet;
let api: string;
let ads: string;

beforeAll(async () => {
  inet = await createTestInternet({ linkNet: 70, routedNet: 71, hosts: [10, 20], port: 47280 });
  [api, ads] = inet.routed;
  env = await startDaytonaEnv();
}, 180_000);

afterAll(async () => {
  await env?.server.close();
  inet?.close();
}, 120_000);

async function reach(sb: Sandbox, address: string): Promise<string> {
  return (await sb.process.executeCommand(`python3 -c "$PROBE" ${address} ${inet.port}`, undefined, { PROBE: TCP_PROBE }, 30)).result.trim();
}

describe('Daytona network settings', () => {
  it('reports and enforces networkBlockAll and networkAllowList as created', async () => {
    const blocked = await env.daytona.create({ networkBlockAll: true });
    const listed = await env.daytona.create({ networkAllowList: `${api}/32` });
    try {
      expect(blocked.networkBlockAll).toBe(true);
      expect(blocked.networkAllowList).toBeUndefined();
      expect(await reach(blocked, api)).toBe('timeout');

      expect(listed.networkBlockAll).toBe(false);
      expect(listed.networkAllowList).toBe(`${api}/32`);
      expect(await reach(listed, api)).toBe('ok');
      expect(await reach(listed, ads)).toBe('timeout');
      // The same on a fresh read (list items carry no network fields for the SDK to read).
      const again = await env.daytona.get(listed.id);
      expect(again.networkBlockAll).toBe(false);
      expect(again.networkAllowList).toBe(`${api}/32`);
      expect((await env.daytona.get(blocked.id)).networkBlockAll).toBe(true);
    } finally {
      await blocked.delete();
      await listed.delete();
    }
  });

  it('changes the policy of a running sandbox with updateNetworkSettings, each call replacing the last', async () => {
    const sb = await env.daytona.create();
    try {
      expect(sb.networkBlockAll).toBe(false);
      expect(sb.networkAllowList).toBeUndefined();
      expect(await reach(sb, ads)).toBe('ok');

      await sb.updateNetworkSettings({ networkAllowList: api, domainAllowList: 'localhost' });
      expect(sb.networkAllowList).toBe(api);
      expect(sb.domainAllowList).toBe('localhost');
      expect(await reach(sb, api)).toBe('ok');
      expect(await reach(sb, ads)).toBe('timeout');

      await sb.updateNetworkSettings({ networkBlockAll: true });
      expect(sb.networkBlockAll).toBe(true);
      expect(sb.networkAllowList).toBeUndefined();
      expect(await reach(sb, api)).toBe('timeout');

      await sb.updateNetworkSettings({ networkBlockAll: false });
      expect(sb.networkBlockAll).toBe(false);
      expect(await reach(sb, ads)).toBe('ok');
      expect((await env.server.http.get(`/api/v1/sandboxes/${sb.id}`).set(env.server.auth)).body.egress).toEqual({ mode: 'allow-all' });

      // A bad entry is a 400 naming the Daytona field; the policy in force stays.
      const error = await sb.updateNetworkSettings({ networkAllowList: `${api},10.0.0.0/33` }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(DaytonaError);
      expect((error as DaytonaError).statusCode).toBe(400);
      expect(String((error as Error).message)).toMatch(/networkAllowList\[1\]/);
      await expect(env.daytona.create({ domainAllowList: '*.daytona.io' })).rejects.toThrow(/domainAllowList\[0\]: .*wildcard/);
      expect(await reach(sb, ads)).toBe('ok');
    } finally {
      await sb.delete();
    }
  });
});

// Egress policies against the real kernel: a slot built by the real slot pool, its policy
// resolved by resolveEgress and rendered into the real nft table, connections made from inside
// the slot's namespace to a test "outside" namespace this file creates (RFC 2544 benchmarking
// addresses, routed only to that namespace). Deny lists must win over allow lists, for CIDRs and
// for domains, and a policy without a deny list must leave nothing of an earlier one behind.
//
// Domains resolve through a resolver given to resolveEgress (as the local driver's
// `egressResolver` option does), so no real name server is asked and no real address is reached.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SlotAllocator, VETH_PREFIX, type Slot } from './slots.js';
import { sandboxDnsServers } from './dns.js';
import { applyNftRuleset, listSlotChain, listSlotNftObjects, renderNftRuleset, renderSlotEgress } from './nft.js';
import { resolveEgress, type EgressPolicy } from './egress.js';
import { silentLogger } from '../../core/logger.js';
import { SlotPool } from './slot-pool.js';
import { TCP_PROBE } from '../../test/test-internet.js';

const isRoot = process.getuid?.() === 0;
const SUBNET = '10.200.0.0/16';
const suffix = randomBytes(4).toString('hex');
const OUTSIDE_NS = `nbxeg-${suffix}`;
const OUTSIDE_LINK = `nbxeg${suffix}`;
// The outside namespace sits behind 198.18.40.0/24 and answers on a second range routed to it.
const OUTSIDE_HOST_SIDE = '198.18.40.1';
const OUTSIDE_ADDRESS = '198.18.40.2';
const ROUTED_RANGE = '198.18.41.0/24';
const API_ADDRESS = '198.18.41.10';
const ADS_ADDRESS = '198.18.41.20';
const PORT = 47080;
/** The test's names: nothing outside this file resolves them. */
const NAMES: Record<string, string[]> = { 'api.test': [API_ADDRESS], 'ads.test': [ADS_ADDRESS] };
const resolver = async (name: string) => NAMES[name] ?? [];


const sh = (file: string, args: string[]) => execFileSync(file, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const quietly = (fn: () => unknown) => {
  try {
    fn();
  } catch {
    // already gone
  }
};

describe.skipIf(!isRoot)('egress policies (real kernel)', () => {
  const owner = `egress-${suffix}`;
  const allocator = new SlotAllocator(SUBNET);
  const pool = new SlotPool({ allocator, owner, size: 0, vethPrefix: VETH_PREFIX, logger: silentLogger });
  let slot: Slot;
  let server: ChildProcess | undefined;
  const servedDir = mkdtempSync('/tmp/nbx-egress-');

  const probe = (address: string) => sh('ip', ['netns', 'exec', slot.netns, 'python3', '-c', TCP_PROBE, address, String(PORT)]).trim();
  const apply = async (policy: EgressPolicy) => {
    const resolved = await resolveEgress(policy, resolver);
    await applyNftRuleset(renderSlotEgress(slot.index, VETH_PREFIX, resolved.rules));
    return resolved;
  };

  beforeAll(async () => {
    // The table as a host agent applies it (same resolvers as the driver, so no other agent's
    // DNS allowance changes).
    await applyNftRuleset(renderNftRuleset({ subnet: SUBNET, vethPrefix: VETH_PREFIX, dnsServers: await sandboxDnsServers() }));
    slot = (await pool.take(`egress${suffix}`)).slot;

    sh('ip', ['netns', 'add', OUTSIDE_NS]);
    sh('ip', ['link', 'add', OUTSIDE_LINK, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', OUTSIDE_NS]);
    sh('ip', ['addr', 'add', `${OUTSIDE_HOST_SIDE}/24`, 'dev', OUTSIDE_LINK]);
    sh('ip', ['link', 'set', OUTSIDE_LINK, 'up']);
    sh('ip', ['-n', OUTSIDE_NS, 'addr', 'add', `${OUTSIDE_ADDRESS}/24`, 'dev', 'eth0']);
    sh('ip', ['-n', OUTSIDE_NS, 'addr', 'add', `${API_ADDRESS}/32`, 'dev', 'lo']);
    sh('ip', ['-n', OUTSIDE_NS, 'addr', 'add', `${ADS_ADDRESS}/32`, 'dev', 'lo']);
    sh('ip', ['-n', OUTSIDE_NS, 'link', 'set', 'eth0', 'up']);
    sh('ip', ['-n', OUTSIDE_NS, 'link', 'set', 'lo', 'up']);
    sh('ip', ['route', 'add', ROUTED_RANGE, 'via', OUTSIDE_ADDRESS, 'dev', OUTSIDE_LINK]);

    server = spawn('ip', ['netns', 'exec', OUTSIDE_NS, 'python3', '-m', 'http.server', String(PORT), '--bind', '0.0.0.0', '--directory', servedDir], { stdio: 'ignore' });
    // Bounded wait for the server, from the host (no policy involved).
    const deadline = Date.now() + 15_000;
    while (sh('python3', ['-c', TCP_PROBE, API_ADDRESS, String(PORT)]).trim() !== 'ok') {
      if (Date.now() > deadline) throw new Error('the outside server did not come up');
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }, 120_000);

  afterAll(async () => {
    server?.kill('SIGKILL');
    rmSync(servedDir, { recursive: true, force: true });
    quietly(() => sh('ip', ['route', 'del', ROUTED_RANGE]));
    quietly(() => sh('ip', ['link', 'del', OUTSIDE_LINK]));
    quietly(() => sh('ip', ['netns', 'del', OUTSIDE_NS]));
    if (slot) await pool.release(slot);
    await pool.close();
    expect((await allocator.claims()).filter((claim) => claim.owner === owner)).toEqual([]);
  }, 120_000);

  it('reaches every outside address with allow-all (the baseline the other cases narrow)', async () => {
    await apply({ mode: 'allow-all' });
    expect(probe(OUTSIDE_ADDRESS)).toBe('ok');
    expect(probe(API_ADDRESS)).toBe('ok');
    expect(probe(ADS_ADDRESS)).toBe('ok');
  });

  it('drops an address the allow list covers when the deny list names it too (deny wins)', async () => {
    await apply({ mode: 'allow-list', allow: [ROUTED_RANGE], deny: [ADS_ADDRESS] });
    expect(probe(API_ADDRESS)).toBe('ok');
    expect(probe(ADS_ADDRESS)).toBe('timeout');
    expect(probe(OUTSIDE_ADDRESS)).toBe('timeout'); // not on the allow list at all
    expect(await listSlotChain(slot.index)).toMatch(/deny4_\d+ drop[\s\S]*allow4_\d+ return/);
  });

  it('drops only the deny list with allow-all', async () => {
    await apply({ mode: 'allow-all', deny: [ROUTED_RANGE] });
    expect(probe(API_ADDRESS)).toBe('timeout');
    expect(probe(ADS_ADDRESS)).toBe('timeout');
    expect(probe(OUTSIDE_ADDRESS)).toBe('ok');
  });

  it('denies a domain by the addresses it resolves to while an allowed domain works', async () => {
    const listed = await apply({ mode: 'allow-list', allow: ['api.test', 'ads.test'], deny: ['ads.test'] });
    expect(listed.rules).toMatchObject({ addresses: [API_ADDRESS, ADS_ADDRESS].sort(), denied: [ADS_ADDRESS] });
    expect(probe(API_ADDRESS)).toBe('ok');
    expect(probe(ADS_ADDRESS)).toBe('timeout');

    await apply({ mode: 'allow-all', deny: ['ads.test'] });
    expect(probe(ADS_ADDRESS)).toBe('timeout');
    expect(probe(API_ADDRESS)).toBe('ok');
    expect(probe(OUTSIDE_ADDRESS)).toBe('ok');
  });

  it('leaves nothing of a deny list behind when a policy without one replaces it', async () => {
    await apply({ mode: 'allow-all', deny: [ADS_ADDRESS] });
    expect(probe(ADS_ADDRESS)).toBe('timeout');
    await apply({ mode: 'allow-all' });
    expect(probe(ADS_ADDRESS)).toBe('ok');
    expect((await listSlotNftObjects(VETH_PREFIX)).get(slot.index)).toMatchObject({ chain: true, allowSet: true, denySet: true });
    expect(sh('nft', ['list', 'set', 'inet', 'nestbox', `deny4_${slot.index}`])).not.toContain(ADS_ADDRESS);
  });
});

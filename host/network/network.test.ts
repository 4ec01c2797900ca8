// Slot arithmetic, machine-wide claims and the nftables ruleset.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { SlotAllocator, assertMachineNetnsMounts, canonicalIpv4, parseIpv4Cidr, parseNetDev, slotCapacity, slotFor } from './slots.js';
import { renderNftRuleset, renderSlotEgress, renderSlotRemoval, renderSlotSourceCheck } from './nft.js';
import { resolveEgress } from './egress.js';

describe('slots', () => {
  let dir: string | undefined;
  afterEach(() => dir && rmSync(dir, { recursive: true, force: true }));

  it('gives each index its own /31 inside the subnet', () => {
    expect(slotFor('10.200.0.0/16', 0)).toEqual({ index: 0, netns: 'nbx-0', hostInterface: 'nbxv0', sandboxAddress: '10.200.0.0', hostAddress: '10.200.0.1' });
    expect(slotFor('10.200.0.0/16', 300)).toMatchObject({ sandboxAddress: '10.200.2.88', hostAddress: '10.200.2.89' });
    expect(slotCapacity('10.200.0.0/16')).toBe(32768);
    expect(() => slotFor('10.200.0.0/16', 32768)).toThrow();
    expect(() => parseIpv4Cidr('10.200.0.0/33')).toThrow();
    expect(parseIpv4Cidr('10.200.7.9/16').base).toBe(parseIpv4Cidr('10.200.0.0/16').base);
  });

  it('never hands the same index to two racing allocators, and records the owner', async () => {
    dir = mkdtempSync('/tmp/nbx-slots-');
    const a = new SlotAllocator('10.200.0.0/16', dir);
    const b = new SlotAllocator('10.200.0.0/16', dir);
    const claims = await Promise.all(Array.from({ length: 20 }, (_, n) => (n % 2 ? a : b).claim(n % 2 ? 'owner-a' : 'owner-b', `sb${n}`)));
    const indices = claims.map((slot) => slot.index);
    expect(new Set(indices).size).toBe(20);
    const record = JSON.parse(readFileSync(join(dir, String(claims[3].index)), 'utf8'));
    expect(record).toMatchObject({ owner: 'owner-a', sandboxId: 'sb3' });
    await a.release(claims[0].index);
    expect((await b.claims()).length).toBe(19);
  });

  it('keeps pool slots as claims without a sandbox and hands them over atomically', async () => {
    dir = mkdtempSync('/tmp/nbx-slots-');
    const a = new SlotAllocator('10.200.0.0/16', dir);
    const pooled = await a.claim('owner-a', '');
    expect((await a.claims())[0]).toMatchObject({ index: pooled.index, owner: 'owner-a', sandboxId: '', pooled: true });
    await a.reassign(pooled.index, 'owner-a', 'sb1');
    const claims = await a.claims();
    expect(claims).toHaveLength(1); // no temp file counted as a claim
    expect(claims[0]).toMatchObject({ index: pooled.index, sandboxId: 'sb1' });
    expect(claims[0].pooled).toBeUndefined();
  });
});

describe('nftables ruleset', () => {
  it('drops sandbox→host and sandbox→private traffic, allows DNS to the given resolvers, masquerades', () => {
    const text = renderNftRuleset({ subnet: '10.200.0.0/16', vethPrefix: 'nbxv', dnsServers: ['10.255.255.53'] });
    // Never destructive: other host agents' per-slot chains and map elements must survive.
    expect(text).not.toContain('delete table');
    expect(text).not.toMatch(/flush (map|set) inet nestbox egress/);
    expect(text).toContain('add rule inet nestbox input iifname "nbxv*" ct state established,related accept\nadd rule inet nestbox input iifname "nbxv*" drop');
    expect(text).toContain('iifname "nbxv*" ip daddr @blocked4 drop');
    expect(text).toContain('10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.168.0.0/16');
    // The per-slot egress jump comes before every accept of sandbox-originated traffic.
    expect(text.indexOf('iifname vmap @egress')).toBeLessThan(text.indexOf('@dns4 udp dport 53 accept'));
    expect(text.indexOf('@dns4 udp dport 53 accept')).toBeLessThan(text.indexOf('@blocked4 drop'));
    expect(text).toContain('ip saddr 10.200.0.0/16 oifname != "nbxv*" masquerade');
    expect(() => renderNftRuleset({ subnet: '10.200.0.0/16; flush ruleset', vethPrefix: 'nbxv', dnsServers: [] })).toThrow();
    expect(() => renderNftRuleset({ subnet: '10.200.0.0/16', vethPrefix: 'nbxv', dnsServers: ['10.9.9.9 } ; flush ruleset'] })).toThrow();
  });

  it('checks every slot packet\'s source before conntrack: no IPv6, strict reverse path, the slot\'s own address', () => {
    const text = renderNftRuleset({ subnet: '10.200.0.0/16', vethPrefix: 'nbxv', dnsServers: [] });
    expect(text).toContain('add chain inet nestbox prerouting { type filter hook prerouting priority raw; policy accept; }');
    expect(text).toMatch(/prerouting iifname "nbxv\*" meta nfproto ipv6 counter drop/);
    expect(text).toMatch(/prerouting iifname "nbxv\*" fib saddr \. iif oif missing counter drop/);
    expect(text).toMatch(/prerouting iifname @slot_ifaces iifname \. ip saddr != @slot_src4 counter drop/);
    // The slots' elements are theirs: a re-apply never empties them.
    expect(text).not.toMatch(/flush set inet nestbox slot_/);
    const check = renderSlotSourceCheck(slotFor('10.200.0.0/16', 7));
    expect(check).toContain('add element inet nestbox slot_src4 { "nbxv7" . 10.200.0.14 }');
    expect(check).toContain('add element inet nestbox slot_ifaces { "nbxv7" }');
    expect(() => renderSlotSourceCheck({ index: 7, hostInterface: 'nbxv7', sandboxAddress: '10.0.0.1 }; flush ruleset' })).toThrow();
  });

  it('deletes only the per-slot objects that exist, map element before chain, chain before set', () => {
    const all = renderSlotRemoval({ index: 7, chain: true, allowSet: true, denySet: true, egressElement: true, ifaceElement: true, sourceAddresses: ['10.200.0.14'] }, 'nbxv');
    expect(all.split('\n').filter(Boolean)).toEqual([
      'delete element inet nestbox egress { "nbxv7" }',
      'flush chain inet nestbox slot_7',
      'delete chain inet nestbox slot_7',
      'delete set inet nestbox allow4_7',
      'delete set inet nestbox deny4_7',
      'delete element inet nestbox slot_ifaces { "nbxv7" }',
      'delete element inet nestbox slot_src4 { "nbxv7" . 10.200.0.14 }',
    ]);
    expect(renderSlotRemoval({ index: 7, chain: false, allowSet: false, egressElement: false, ifaceElement: false, sourceAddresses: [] }, 'nbxv')).toBe('');
  });

  it('renders each egress mode into the slot chain and refuses anything but addresses', () => {
    const allowAll = renderSlotEgress(7, 'nbxv', { mode: 'allow-all', addresses: [] });
    expect(allowAll).toContain('flush chain inet nestbox slot_7');
    expect(allowAll).toContain('add element inet nestbox egress { "nbxv7" : jump slot_7 }');
    expect(allowAll).not.toContain('add rule');
    const denyAll = renderSlotEgress(7, 'nbxv', { mode: 'deny-all', addresses: [] });
    expect(denyAll).toContain('add rule inet nestbox slot_7 drop');
    expect(denyAll).not.toContain('dport 53');
    const list = renderSlotEgress(7, 'nbxv', { mode: 'allow-list', addresses: ['203.0.113.0/24', '198.51.100.7'] });
    expect(list).toContain('add element inet nestbox allow4_7 { 203.0.113.0/24, 198.51.100.7 }');
    expect(list.indexOf('ip daddr @allow4_7 return')).toBeLessThan(list.lastIndexOf('drop'));
    expect(() => renderSlotEgress(7, 'nbxv', { mode: 'allow-list', addresses: ['1.2.3.4 } ; flush ruleset'] })).toThrow();
    expect(() => renderSlotEgress(-1, 'nbxv', { mode: 'allow-all', addresses: [] })).toThrow();
  });

  it('drops a deny list before any allow, keeps DNS to the resolvers, and empties the deny set otherwise', () => {
    const rules = (text: string) => text.split('\n').filter((line) => line.startsWith('add rule'));
    const listed = renderSlotEgress(7, 'nbxv', { mode: 'allow-list', addresses: ['203.0.113.0/24'], denied: ['203.0.113.9'] });
    expect(listed).toContain('add element inet nestbox deny4_7 { 203.0.113.9 }');
    expect(rules(listed)).toEqual([
      'add rule inet nestbox slot_7 ip daddr @dns4 udp dport 53 return',
      'add rule inet nestbox slot_7 ip daddr @dns4 tcp dport 53 return',
      'add rule inet nestbox slot_7 ip daddr @deny4_7 drop',
      'add rule inet nestbox slot_7 ip daddr @allow4_7 return',
      'add rule inet nestbox slot_7 drop',
    ]);
    const allowAll = renderSlotEgress(7, 'nbxv', { mode: 'allow-all', addresses: [], denied: ['198.51.100.0/24'] });
    expect(rules(allowAll)).toEqual([
      'add rule inet nestbox slot_7 ip daddr @dns4 udp dport 53 return',
      'add rule inet nestbox slot_7 ip daddr @dns4 tcp dport 53 return',
      'add rule inet nestbox slot_7 ip daddr @deny4_7 drop',
    ]);
    // A re-apply without a deny list empties the set an earlier one filled.
    const plain = renderSlotEgress(7, 'nbxv', { mode: 'allow-all', addresses: [] });
    expect(plain).toContain('flush set inet nestbox deny4_7');
    expect(plain).not.toContain('add element inet nestbox deny4_7');
    // Deny-all needs no deny list, and DNS stays closed.
    expect(rules(renderSlotEgress(7, 'nbxv', { mode: 'deny-all', addresses: [], denied: ['198.51.100.1'] }))).toEqual(['add rule inet nestbox slot_7 drop']);
    expect(() => renderSlotEgress(7, 'nbxv', { mode: 'allow-all', addresses: [], denied: ['1.2.3.4 } ; flush ruleset'] })).toThrow();
  });
});

describe('egress policy resolution', () => {
  it('canonicalises CIDRs, resolves domains with the given resolver and reports the unresolvable', async () => {
    const resolver = async (name: string) => (name === 'api.example.com' ? ['93.184.216.34', '93.184.216.35'] : []);
    const resolved = await resolveEgress({ mode: 'allow-list', allow: ['203.0.113.9/24', 'API.example.com', 'nowhere.invalid', '198.51.100.1'] }, resolver);
    expect(resolved.rules).toEqual({ mode: 'allow-list', addresses: ['198.51.100.1', '203.0.113.0/24', '93.184.216.34', '93.184.216.35'], denied: [] });
    expect(resolved.unresolved).toEqual(['nowhere.invalid']);
    expect(resolved.hasDomains).toBe(true);
    expect((await resolveEgress(undefined)).rules).toEqual({ mode: 'allow-all', addresses: [], denied: [] });
    expect((await resolveEgress({ mode: 'deny-all' })).rules).toEqual({ mode: 'deny-all', addresses: [], denied: [] });
    expect(canonicalIpv4('10.1.2.3')).toBe('10.1.2.3');
  });

  it('resolves deny lists like allow lists, for allow-all and allow-list, and counts their domains for refreshes', async () => {
    const resolver = async (name: string) => (name === 'ads.example.com' ? ['93.184.216.40'] : name === 'api.example.com' ? ['93.184.216.34'] : []);
    const listed = await resolveEgress({ mode: 'allow-list', allow: ['api.example.com', '93.184.216.0/24'], deny: ['ads.example.com', '198.51.100.7/24', 'gone.invalid'] }, resolver);
    expect(listed.rules).toEqual({ mode: 'allow-list', addresses: ['93.184.216.0/24', '93.184.216.34'], denied: ['198.51.100.0/24', '93.184.216.40'] });
    expect(listed.unresolved).toEqual(['gone.invalid']);
    const open = await resolveEgress({ mode: 'allow-all', deny: ['ads.example.com'] }, resolver);
    expect(open).toMatchObject({ rules: { mode: 'allow-all', addresses: [], denied: ['93.184.216.40'] }, hasDomains: true });
    expect((await resolveEgress({ mode: 'allow-all', deny: ['198.51.100.7'] }, resolver)).hasDomains).toBe(false);
    expect(canonicalIpv4('10.1.2.3/8')).toBe('10.0.0.0/8');
  });
});

describe('the host agent\'s own network namespace', () => {
  it('reads device counters from /proc/net/dev, the namespace of the reader', () => {
    const text = [
      'Inter-|   Receive                                                |  Transmit',
      ' face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed',
      '    lo:     100       2    0    0    0     0          0         0      100       2    0    0    0     0       0          0',
      ' nbxv12: 5120 40 0 0 0 0 0 0 777 9 0 0 0 0 0 0',
      '  eth0:1234567890 1 0 0 0 0 0 0 42 1 0 0 0 0 0 0',
      '',
    ].join('\n');
    const devices = parseNetDev(text);
    expect([...devices.keys()]).toEqual(['lo', 'nbxv12', 'eth0']);
    expect(devices.get('nbxv12')).toEqual({ rxBytes: 5120, txBytes: 777 });
    expect(devices.get('eth0')).toEqual({ rxBytes: 1234567890, txBytes: 42 });
  });

  it('accepts a shared /run/netns (or none yet) and refuses the slave one `ip netns exec` makes', () => {
    const root = '46 27 254:0 /run/netns /run/netns rw,relatime shared:1 - ext4 /dev/vda rw\n47 46 0:4 net:[4026532178] /run/netns/nbx-0 rw shared:2 - nsfs nsfs rw\n';
    expect(() => assertMachineNetnsMounts(root)).not.toThrow();
    expect(() => assertMachineNetnsMounts('22 1 254:0 / / rw shared:1 - ext4 /dev/vda rw\n')).not.toThrow();
    const netnsExec = '612 611 254:0 /run/netns /run/netns rw,relatime master:1 - ext4 /dev/vda rw\n';
    expect(() => assertMachineNetnsMounts(netnsExec)).toThrow(/not shared with the machine.*master:1.*nsenter --net=/s);
  });
});

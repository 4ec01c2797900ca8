// Slot arithmetic, machine-wide claims and the nftables ruleset.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { SlotAllocator, parseIpv4Cidr, slotCapacity, slotFor } from './network.js';
import { renderNftRuleset } from './nft.js';

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
});

describe('nftables ruleset', () => {
  it('drops sandbox→host and sandbox→private traffic, allows DNS to the given resolvers, masquerades', () => {
    const text = renderNftRuleset({ subnet: '10.200.0.0/16', vethPrefix: 'nbxv', dnsServers: ['10.255.255.53'] });
    // Replacing the table atomically: create-if-missing, delete, recreate, in one transaction.
    expect(text.indexOf('delete table inet nestbox')).toBeLessThan(text.lastIndexOf('table inet nestbox {'));
    expect(text).toContain('iifname "nbxv*" ct state established,related accept\n    iifname "nbxv*" drop');
    expect(text).toContain('iifname "nbxv*" ip daddr @blocked4 drop');
    expect(text).toContain('10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.168.0.0/16');
    expect(text.indexOf('@dns4 udp dport 53 accept')).toBeLessThan(text.indexOf('@blocked4 drop'));
    expect(text).toContain('ip saddr 10.200.0.0/16 oifname != "nbxv*" masquerade');
    expect(() => renderNftRuleset({ subnet: '10.200.0.0/16; flush ruleset', vethPrefix: 'nbxv', dnsServers: [] })).toThrow();
    expect(() => renderNftRuleset({ subnet: '10.200.0.0/16', vethPrefix: 'nbxv', dnsServers: ['1.1.1.1 } ; flush ruleset'] })).toThrow();
  });
});

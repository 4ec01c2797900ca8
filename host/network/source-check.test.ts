// Anti-spoofing against the real kernel: slots built by the real slot pool, the real nft table,
// packets with forged sources written by a raw socket inside a slot's namespace (what root in a
// sandbox can do: it has CAP_NET_RAW but no CAP_NET_ADMIN). Forged packets must go nowhere — not
// to a host outside the slots (a namespace this test creates), not into the host as part of
// another slot's connection — while the same socket sending with the slot's own address works.
//
// Order, not time, tells "dropped" from "late": each forged packet is sent before a genuine one
// on the same path, so once the genuine one has arrived a forged one would have too.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createSocket, type Socket } from 'node:dgram';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SlotAllocator, VETH_PREFIX, type Slot } from './slots.js';
import { sandboxDnsServers } from './dns.js';
import { NFT_TABLE, SPOOF_RULE_COMMENTS, applyNftRuleset, listSlotNftObjects, renderNftRuleset } from './nft.js';
import { SlotPool } from './slot-pool.js';

const isRoot = process.getuid?.() === 0;
const SUBNET = '10.200.0.0/16';
const suffix = randomBytes(4).toString('hex');
// The test's "outside" host: a namespace of its own behind a veth (not matching `nbxv*`).
const OUTSIDE_NS = `nbxsc-${suffix}`;
const OUTSIDE_LINK = `nbxsc${suffix}`;
// RFC 2544 benchmarking range: neither the host's own network nor the other tests' ranges.
const OUTSIDE_HOST_SIDE = '198.18.5.1';
const OUTSIDE_ADDRESS = '198.18.5.2';
const OUTSIDE_PORT = 47001;
/** A source no slot owns and no route leads back to through a slot. */
const FOREIGN_SOURCE = '198.19.7.7';
const B_PORT = 40001;

/** One UDP datagram with a chosen IPv4 source, through a raw socket (the kernel fills in the IP checksum). */
const RAW_SENDER = String.raw`
import socket, struct, sys
src, sport, dst, dport, payload = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5].encode()
udp = struct.pack('!HHHH', sport, dport, 8 + len(payload), 0) + payload
ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst))
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
s.sendto(ip + udp, (dst, 0))
print('sent')
`;

/** Prints every datagram it receives, one line each; with `echo`, answers each to its sender. */
const UDP_LISTENER = String.raw`
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('0.0.0.0', int(sys.argv[1])))
print('ready', flush=True)
while True:
    data, peer = s.recvfrom(2048)
    print(data.decode(errors='replace'), flush=True)
    if len(sys.argv) > 2: s.sendto(b'echo:' + data, peer)
`;

const sh = (file: string, args: string[]) => execFileSync(file, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
const quietly = (fn: () => unknown) => {
  try {
    fn();
  } catch {
    // already gone
  }
};

interface Listener {
  process: ChildProcess;
  lines: string[];
}

function listen(netns: string, port: number, echo: boolean): Promise<Listener> {
  const child = spawn('ip', ['netns', 'exec', netns, 'python3', '-c', UDP_LISTENER, String(port), ...(echo ? ['echo'] : [])], { stdio: ['ignore', 'pipe', 'inherit'] });
  const listener: Listener = { process: child, lines: [] };
  let buffer = '';
  return new Promise((resolve, reject) => {
    child.once('error', reject);
    child.stdout!.on('data', (chunk: Buffer) => {
      buffer += chunk.toString();
      const parts = buffer.split('\n');
      buffer = parts.pop()!;
      for (const line of parts) {
        if (line === 'ready') resolve(listener);
        else listener.lines.push(line);
      }
    });
  });
}

/** A datagram from the host's socket, sent for sure before the call returns (dgram sends asynchronously). */
function hostSend(socket: Socket, message: string, port: number, address: string): Promise<void> {
  return new Promise((resolve, reject) => socket.send(message, port, address, (error) => (error ? reject(error) : resolve())));
}

function sendRaw(slot: Slot, src: string, sport: number, dst: string, dport: number, payload: string): void {
  expect(sh('ip', ['netns', 'exec', slot.netns, 'python3', '-c', RAW_SENDER, src, String(sport), dst, String(dport), payload]).trim()).toBe('sent');
}

/** Bounded wait for something that must happen (no timing threshold is asserted). */
async function eventually(what: string, check: () => boolean, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

function spoofDrops(): number {
  const listing = JSON.parse(sh('nft', ['-j', 'list', 'chain', 'inet', NFT_TABLE, 'prerouting'])) as { nftables: { rule?: { comment?: string; expr: { counter?: { packets: number } }[] } }[] };
  let packets = 0;
  for (const item of listing.nftables) {
    if (item.rule?.comment === SPOOF_RULE_COMMENTS.reversePath || item.rule?.comment === SPOOF_RULE_COMMENTS.slotAddress) {
      packets += item.rule.expr.find((expr) => expr.counter)?.counter?.packets ?? 0;
    }
  }
  return packets;
}

describe.skipIf(!isRoot)('slot source check (real kernel)', () => {
  const owner = `srccheck-${suffix}`;
  const allocator = new SlotAllocator(SUBNET);
  const pool = new SlotPool({ allocator, owner, size: 0, vethPrefix: VETH_PREFIX, log: () => {} });
  const listeners: Listener[] = [];
  let a: Slot;
  let b: Slot;
  let hostSocket: Socket;
  const hostReceived: string[] = [];

  beforeAll(async () => {
    // The table as a host agent applies it (same resolvers as the driver, so no other agent's
    // DNS allowance changes).
    await applyNftRuleset(renderNftRuleset({ subnet: SUBNET, vethPrefix: VETH_PREFIX, dnsServers: await sandboxDnsServers() }));
    a = (await pool.take('spoofer')).slot;
    b = (await pool.take('victim')).slot;

    sh('ip', ['netns', 'add', OUTSIDE_NS]);
    sh('ip', ['link', 'add', OUTSIDE_LINK, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', OUTSIDE_NS]);
    sh('ip', ['addr', 'add', `${OUTSIDE_HOST_SIDE}/24`, 'dev', OUTSIDE_LINK]);
    sh('ip', ['link', 'set', OUTSIDE_LINK, 'up']);
    sh('ip', ['-n', OUTSIDE_NS, 'addr', 'add', `${OUTSIDE_ADDRESS}/24`, 'dev', 'eth0']);
    sh('ip', ['-n', OUTSIDE_NS, 'link', 'set', 'eth0', 'up']);
    sh('ip', ['-n', OUTSIDE_NS, 'link', 'set', 'lo', 'up']);
    // Back to the forged sources, so an answer would be routed if a forged packet got through.
    sh('ip', ['-n', OUTSIDE_NS, 'route', 'add', 'default', 'via', OUTSIDE_HOST_SIDE]);

    hostSocket = createSocket('udp4');
    hostSocket.on('message', (message) => hostReceived.push(message.toString()));
    await new Promise<void>((resolve) => hostSocket.bind(0, '0.0.0.0', resolve));
  }, 120_000);

  afterAll(async () => {
    for (const listener of listeners) listener.process.kill('SIGKILL');
    hostSocket?.close();
    quietly(() => sh('ip', ['link', 'del', OUTSIDE_LINK]));
    quietly(() => sh('ip', ['netns', 'del', OUTSIDE_NS]));
    // Listeners inside the slots must be gone before the pool takes them apart.
    await new Promise((resolve) => setTimeout(resolve, 200));
    if (a) await pool.release(a);
    if (b) await pool.release(b);
    await pool.close();
    expect((await allocator.claims()).filter((claim) => claim.owner === owner)).toEqual([]);
  }, 120_000);

  it('builds each slot with its veth, its one source address and strict reverse-path filtering', async () => {
    const objects = (await listSlotNftObjects(VETH_PREFIX)).get(a.index);
    expect(objects).toMatchObject({ chain: true, allowSet: true, egressElement: true, ifaceElement: true, sourceAddresses: [a.sandboxAddress] });
    expect(readFileSync(`/proc/sys/net/ipv4/conf/${a.hostInterface}/rp_filter`, 'utf8').trim()).toBe('1');
    expect(readFileSync(`/proc/sys/net/ipv6/conf/${a.hostInterface}/disable_ipv6`, 'utf8').trim()).toBe('1');
    const chain = sh('nft', ['list', 'chain', 'inet', NFT_TABLE, 'prerouting']);
    expect(chain).toContain('priority raw');
    expect(chain).toMatch(/iifname "nbxv\*" meta nfproto ipv6 .*drop/);
  });

  it('drops packets forged with another slot\'s or an outside address; the slot\'s own address gets through', async () => {
    const outside = await listen(OUTSIDE_NS, OUTSIDE_PORT, true);
    listeners.push(outside);
    const victim = await listen(b.netns, B_PORT, false);
    listeners.push(victim);
    const dropsBefore = spoofDrops();

    // A poses as B (the answer would be delivered into B) and as an outside address.
    sendRaw(a, b.sandboxAddress, B_PORT, OUTSIDE_ADDRESS, OUTSIDE_PORT, 'forged-as-b');
    sendRaw(a, FOREIGN_SOURCE, 5000, OUTSIDE_ADDRESS, OUTSIDE_PORT, 'forged-as-outside');
    sendRaw(a, a.sandboxAddress, 5001, OUTSIDE_ADDRESS, OUTSIDE_PORT, 'genuine-from-a');
    await eventually('the genuine packet at the outside host', () => outside.lines.includes('genuine-from-a'));
    expect(outside.lines).not.toContain('forged-as-b');
    expect(outside.lines).not.toContain('forged-as-outside');

    // Nothing answered into B: a marker from the host reaches B's listener, and nothing before it.
    await hostSend(hostSocket, 'marker-from-host', B_PORT, b.sandboxAddress);
    await eventually('the host marker in B', () => victim.lines.includes('marker-from-host'));
    expect(victim.lines).toEqual(['marker-from-host']);
    expect(spoofDrops() - dropsBefore).toBeGreaterThanOrEqual(2);
  });

  it('drops packets forged into another slot\'s connection with the host', async () => {
    const hostPort = (hostSocket.address() as { port: number }).port;
    // The host talks to B (as the port proxy does): conntrack now holds B:port ↔ host:hostPort,
    // and the input chain lets established traffic in.
    await hostSend(hostSocket, 'host-to-b', B_PORT, b.sandboxAddress);
    const dropsBefore = spoofDrops();
    sendRaw(a, b.sandboxAddress, B_PORT, b.hostAddress, hostPort, 'injected-as-b');

    // The same from A's own address on A's own flow arrives.
    await hostSend(hostSocket, 'host-to-a', 5002, a.sandboxAddress);
    sendRaw(a, a.sandboxAddress, 5002, a.hostAddress, hostPort, 'genuine-reply-from-a');
    await eventually('the genuine reply at the host', () => hostReceived.includes('genuine-reply-from-a'));
    expect(hostReceived).not.toContain('injected-as-b');
    expect(spoofDrops() - dropsBefore).toBeGreaterThanOrEqual(1);
  });
});

// The VM side of a network slot (host-runtime.md §6): the shared slot of host/network (netns + veth +
// /31) plus, inside the namespace, `tap0` for the VM and NAT between the slot address and the
// guest. Every guest has the same identity (169.254.0.21/30 behind 169.254.0.22, fixed MAC), so
// snapshots and forks never need their network patched; the namespace is what isolates them.
import type { Slot } from '../../network/slots.js';
import { runCommand } from '../../util/run.js';
import { TAP_NAME } from './config.js';

const run = (file: string, args: string[], input?: string) => runCommand(file, args, { timeoutMs: 15_000, input });

export const GUEST_ADDRESS = '169.254.0.21';
export const TAP_ADDRESS = '169.254.0.22';

/** The `ip -batch` lines run inside the slot namespace (`ip -n <ns> -batch -`). */
export function renderTapBatch(): string {
  return [
    // Multi-queue only matters above one queue pair; we configure exactly one (num_queues 2).
    `tuntap add dev ${TAP_NAME} mode tap`,
    `addr add ${TAP_ADDRESS}/30 dev ${TAP_NAME}`,
    `link set ${TAP_NAME} up`,
    '',
  ].join('\n');
}

/** In-namespace NAT: the guest leaves as the slot address; the slot address reaches the guest. */
export function renderSlotNat(slot: Pick<Slot, 'sandboxAddress'>): string {
  return `table ip nestbox_vm {}
delete table ip nestbox_vm
table ip nestbox_vm {
  chain prerouting {
    type nat hook prerouting priority dstnat; policy accept;
    iifname "eth0" ip daddr ${slot.sandboxAddress} dnat to ${GUEST_ADDRESS}
  }
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "eth0" ip saddr ${GUEST_ADDRESS} snat to ${slot.sandboxAddress}
  }
}
`;
}

/** Adds tap0 and NAT to a freshly built slot. A new namespace does not forward: turn it on. */
export async function addVmNetworking(slot: Slot): Promise<void> {
  await run('ip', ['-n', slot.netns, '-batch', '-'], renderTapBatch());
  await run('ip', ['netns', 'exec', slot.netns, 'sysctl', '-q', '-w', 'net.ipv4.ip_forward=1']);
  await run('ip', ['netns', 'exec', slot.netns, 'nft', '-f', '-'], renderSlotNat(slot));
}

// Resize (issue 19): new vCPUs, memory and disk for a sandbox. CPU and memory of a running
// sandbox change live on its host (the local driver writes its cgroups; drivers without live
// resize answer not_supported and the sandbox must be stopped first); a stopped sandbox's CPU
// and memory are only its row (its next start passes them to the host); its disk grows only
// while it is stopped, and never shrinks.
//
// No transitional state: a resize is short and runs as three steps on the row it leaves in
// `running` or `stopped`.
//   1. One transaction, the organisation's row locked (its limits) and the host's (its
//      capacity): what grows is checked, and the row gets the LARGER of old and new for every
//      size, with `operation = 'resize'` as the marker that one is in flight (a second resize
//      meanwhile is a 409 conflict).
//   2. The host applies the new sizes (its own record says the target first: a host agent
//      killed half-way finishes it at its next start).
//   3. The row gets the new sizes and the marker is cleared (on a host failure: the old sizes).
// Crash safety: whatever step a crash interrupts, the row never counts less than the host may
// enforce (it holds max(old, new) until step 3), so capacity and limits are never oversold; a
// marker left behind by a dead control plane expires after RESIZE_STALE_MS, and repeating the
// call converges (the host call is idempotent).
import type { Db } from '../store/db.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { errors, NestboxError, toNestboxError } from '../errors.js';
import { newOperationId } from '../ids.js';
import type { HostClient } from '../host-client.js';
import type { Principal, Sandbox } from '../types.js';
import { requireScope } from './auth.js';
import type { HostService } from './hosts.js';
import { checkWithinLimits, type OrganizationLimits } from './org-limits.js';

/** The size bounds of SandboxLimits (sandboxes.ts) a resize checks against. */
export interface ResizeLimits {
  maxCpu: number;
  minMemoryMiB: number;
  maxMemoryMiB: number;
  defaultDiskGiB: number;
  maxDiskGiB: number;
}

export interface ResizeSandboxInput {
  cpu?: unknown;
  memoryMiB?: unknown;
  diskGiB?: unknown;
}

export const RESIZE_STALE_MS = 10 * 60_000;

export interface ResizeDeps {
  db: Db;
  hosts: HostService;
  limits: ResizeLimits;
  orgLimits: OrganizationLimits;
  load(principal: Principal, id: string): Promise<Sandbox>;
  clientFor(hostId: string): Promise<HostClient>;
}

function validated(input: ResizeSandboxInput, limits: ResizeLimits): { cpu?: number; memoryMiB?: number; diskGiB?: number } {
  const out: { cpu?: number; memoryMiB?: number; diskGiB?: number } = {};
  if (input.cpu !== undefined && input.cpu !== null) {
    if (typeof input.cpu !== 'number' || !Number.isInteger(input.cpu) || input.cpu < 1 || input.cpu > limits.maxCpu) throw errors.validation('cpu', `must be an integer from 1 to ${limits.maxCpu}`);
    out.cpu = input.cpu;
  }
  if (input.memoryMiB !== undefined && input.memoryMiB !== null) {
    if (typeof input.memoryMiB !== 'number' || !Number.isInteger(input.memoryMiB) || input.memoryMiB < limits.minMemoryMiB || input.memoryMiB > limits.maxMemoryMiB) {
      throw errors.validation('memoryMiB', `must be an integer from ${limits.minMemoryMiB} to ${limits.maxMemoryMiB}`);
    }
    out.memoryMiB = input.memoryMiB;
  }
  if (input.diskGiB !== undefined && input.diskGiB !== null) {
    if (typeof input.diskGiB !== 'number' || !Number.isInteger(input.diskGiB) || input.diskGiB < 1 || input.diskGiB > limits.maxDiskGiB) throw errors.validation('diskGiB', `must be an integer from 1 to ${limits.maxDiskGiB}`);
    out.diskGiB = input.diskGiB;
  }
  if (Object.keys(out).length === 0) throw errors.validation('cpu', 'No resource changes specified: give at least one of cpu, memoryMiB and diskGiB');
  return out;
}

export async function resizeSandbox(deps: ResizeDeps, principal: Principal, id: string, input: ResizeSandboxInput): Promise<Sandbox> {
  requireScope(principal, 'sandboxes:operate');
  const change = validated(input, deps.limits);
  const sandbox = await deps.load(principal, id);
  if (sandbox.state !== 'running' && sandbox.state !== 'stopped') throw errors.invalidState('sandbox', id, sandbox.state, ['running', 'stopped'], 'resize');
  const running = sandbox.state === 'running';
  const oldDisk = sandbox.diskGiB ?? deps.limits.defaultDiskGiB;
  if (change.diskGiB !== undefined && change.diskGiB !== oldDisk) {
    if (change.diskGiB < oldDisk) throw errors.validation('diskGiB', `disks only grow: sandbox ${id} has ${oldDisk} GiB`);
    if (running) throw errors.invalidState('sandbox', id, sandbox.state, ['stopped'], 'grow the disk of');
  }
  const target = { cpu: change.cpu ?? sandbox.cpu, memoryMiB: change.memoryMiB ?? sandbox.memoryMiB, diskGiB: change.diskGiB ?? oldDisk };
  if (target.cpu === sandbox.cpu && target.memoryMiB === sandbox.memoryMiB && target.diskGiB === oldDisk) return sandbox; // nothing to do (a retry)
  const reserve = { cpu: Math.max(target.cpu, sandbox.cpu), memoryMiB: Math.max(target.memoryMiB, sandbox.memoryMiB), diskGiB: Math.max(target.diskGiB, oldDisk) };
  const operationId = newOperationId();

  // Step 1: limits, capacity and the marker, in one transaction.
  await deps.db.transaction(async (tx) => {
    const grow = { cpu: running ? reserve.cpu - sandbox.cpu : 0, memoryMiB: running ? reserve.memoryMiB - sandbox.memoryMiB : 0, diskGiB: reserve.diskGiB - oldDisk };
    await checkWithinLimits(tx, sandbox.organizationId, { sandboxes: 0, ...grow }, deps.orgLimits);
    await deps.hosts.assertRoomToGrow(tx, sandbox.hostId!, id, grow);
    const current = await sandboxRepository(tx).findById(id);
    if (!current || current.state !== sandbox.state) throw errors.invalidState('sandbox', id, current?.state ?? 'deleted', ['running', 'stopped'], 'resize');
    const fresh = current.operation === 'resize' && current.operationStartedAt && Date.now() - current.operationStartedAt.getTime() < RESIZE_STALE_MS;
    if (fresh || current.cpu !== sandbox.cpu || current.memoryMiB !== sandbox.memoryMiB || (current.diskGiB ?? deps.limits.defaultDiskGiB) !== oldDisk) {
      throw new NestboxError('conflict', `sandbox ${id} is being resized by another request; try again when it is done`, { id });
    }
    const marked = await sandboxRepository(tx).transition(id, [sandbox.state], { ...reserve, operation: 'resize', operationId, operationOwner: null, operationStartedAt: new Date() }, current.operationId ?? undefined);
    if (!marked) throw new NestboxError('conflict', `sandbox ${id} changed meanwhile; try again`, { id });
  });

  // Step 2: the host (a stopped sandbox's CPU and memory are only its row).
  const hostChange = { ...(running && target.cpu !== sandbox.cpu ? { cpu: target.cpu } : {}), ...(running && target.memoryMiB !== sandbox.memoryMiB ? { memoryMiB: target.memoryMiB } : {}), ...(target.diskGiB !== oldDisk ? { diskGiB: target.diskGiB } : {}) };
  let failure: NestboxError | undefined;
  if (Object.keys(hostChange).length) {
    try {
      await (await deps.clientFor(sandbox.hostId!)).resizeSandbox(id, hostChange);
    } catch (error) {
      failure = toNestboxError(error);
    }
  }

  // Step 3: the sizes now in force, marker cleared (only if still ours: a stop may have begun).
  const sizes = failure ? { cpu: sandbox.cpu, memoryMiB: sandbox.memoryMiB, diskGiB: oldDisk } : target;
  const repo = sandboxRepository(deps.db);
  const written =
    (await repo.transition(id, ['running', 'stopped'], { ...sizes, operation: null, operationId: null, operationOwner: null, operationStartedAt: null }, operationId)) ??
    (await repo.transition(id, ['running', 'stopped', 'stopping', 'starting', 'pausing', 'paused', 'resuming', 'error'], sizes));
  if (failure) {
    if (failure.code === 'not_supported' && running) throw new NestboxError('invalid_state', `sandbox ${id} runs on a host whose driver cannot resize a running sandbox; stop it, resize it, and start it again`, { id, state: 'running', wanted: ['stopped'], operation: 'resize' });
    throw failure;
  }
  return written ?? (await repo.findById(id)) ?? sandbox;
}

// Persistent named volumes (issue 19). A volume belongs to an organisation, has a size limit,
// and lives on one host (an ext4 image there, host/storage/volumes.ts). Sandboxes mount it at
// create (`volumes` on create: a path, read-write or read-only, optionally a subpath); several
// may at once; it outlives them all; it cannot be deleted while a sandbox that is not deleted
// names it. A sandbox that mounts volumes is placed on their host (they must share one).
// Its files can be worked on without any sandbox: the host agent serves them (host/agent/volume-files.ts).
import type { Readable } from 'node:stream';
import type { IncomingMessage } from 'node:http';
import type { Db, DbOrTx } from '../store/db.js';
import { volumeRepository } from '../store/repositories/volumes.js';
import { organizationRepository } from '../store/repositories/organizations.js';
import { errors, NestboxError, toNestboxError } from '../errors.js';
import { randomId } from '../ids.js';
import type { OrganizationLimitOverrides, Principal, SandboxVolumeMount, Volume } from '../types.js';
import { requireScope } from './auth.js';
import type { HostService } from './hosts.js';

const GiB = 2 ** 30;
const NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;
const MiB = 2 ** 20;
export const MIN_VOLUME_BYTES = 64 * MiB;
export const MAX_VOLUME_MOUNTS = 16;
const PATH_COMPONENT = /^[A-Za-z0-9_@+=,.~-]{1,255}$/;
const RESERVED_ROOTS = new Set(['proc', 'sys', 'dev', '.nestbox']);

export interface VolumeLimits {
  /** Size of a volume created without one (Daytona and E2B never give one). */
  defaultSizeBytes: number;
  maxSizeBytes: number;
  /** Per organisation: live volumes, and the sum of their sizes. */
  maxVolumesPerOrganization: number;
  maxTotalBytesPerOrganization: number;
  retryAfterSeconds: number;
}

/**
 * An organisation's volume limits in force, in bytes: its own (PATCH /organizations/{id}
 * `limits.maxVolumes`, `maxVolumeTotalGiB`, `maxVolumeSizeGiB`) over the server's defaults.
 * `own` says which came from the organisation, so a refusal names what to raise.
 */
export function volumeLimitsOf(overrides: Pick<OrganizationLimitOverrides, 'maxVolumes' | 'maxVolumeTotalGiB' | 'maxVolumeSizeGiB'>, defaults: VolumeLimits) {
  return {
    maxVolumes: overrides.maxVolumes ?? defaults.maxVolumesPerOrganization,
    maxTotalBytes: overrides.maxVolumeTotalGiB === null ? defaults.maxTotalBytesPerOrganization : overrides.maxVolumeTotalGiB * GiB,
    maxSizeBytes: overrides.maxVolumeSizeGiB === null ? defaults.maxSizeBytes : overrides.maxVolumeSizeGiB * GiB,
    own: { maxVolumes: overrides.maxVolumes !== null, maxVolumeTotalGiB: overrides.maxVolumeTotalGiB !== null, maxVolumeSizeGiB: overrides.maxVolumeSizeGiB !== null },
  };
}

/** The same, as the organisation API shows its limits in force (GiB; a default not in whole GiB shows its fraction). */
export function volumeLimitsInForce(overrides: Pick<OrganizationLimitOverrides, 'maxVolumes' | 'maxVolumeTotalGiB' | 'maxVolumeSizeGiB'>, defaults: VolumeLimits) {
  const l = volumeLimitsOf(overrides, defaults);
  return { maxVolumes: l.maxVolumes, maxVolumeTotalGiB: l.maxTotalBytes / GiB, maxVolumeSizeGiB: l.maxSizeBytes / GiB };
}

/** A mount as a request gives it: the volume by id or name. */
export interface VolumeMountInput {
  volumeId?: string;
  name?: string;
  mountPath: string;
  readOnly?: boolean;
  subpath?: string;
}

export interface ResolvedMounts {
  mounts: SandboxVolumeMount[];
  hostId: string;
  /** What placement names as the reason for the fixed host. */
  what: string;
}

export const newVolumeId = (): string => `vol${randomId(17)}`;

function pathProblem(path: string, kind: 'mountPath' | 'subpath'): string | undefined {
  if (typeof path !== 'string') return 'must be a string';
  if (kind === 'mountPath' && !path.startsWith('/')) return 'must be an absolute path';
  if (path.length > 1024) return 'must be at most 1024 characters';
  const parts = path.split('/').filter((p) => p !== '');
  if (kind === 'mountPath' && parts.length === 0) return 'cannot be /';
  for (const part of parts) {
    if (part === '.' || part === '..') return "must not contain '.' or '..' components";
    if (!PATH_COMPONENT.test(part)) return 'may only contain letters, digits and _@+=,.~- between slashes';
  }
  if (kind === 'mountPath' && RESERVED_ROOTS.has(parts[0]!)) return `cannot be under /${parts[0]} (the sandbox's own)`;
  return undefined;
}

const normalPath = (path: string) => '/' + path.split('/').filter(Boolean).join('/');

export class VolumeService {
  constructor(
    private readonly db: Db,
    private readonly hosts: HostService,
    readonly limits: VolumeLimits,
  ) {}

  async create(principal: Principal, input: { name: string; sizeBytes?: number }): Promise<Volume> {
    requireScope(principal, 'volumes:write');
    if (typeof input.name !== 'string' || !NAME.test(input.name)) throw errors.validation('name', 'must be 1-63 letters, digits, "_", "." or "-", starting with a letter or digit');
    const org = await organizationRepository(this.db).findById(principal.organizationId);
    if (!org) throw errors.notFound('organization', principal.organizationId);
    const limits = volumeLimitsOf(org.limits, this.limits);
    // A volume created without a size (Daytona, E2B) gets the default, but no more than the organisation's largest.
    const sizeBytes = input.sizeBytes ?? Math.max(MIN_VOLUME_BYTES, Math.min(this.limits.defaultSizeBytes, limits.maxSizeBytes));
    if (!Number.isSafeInteger(sizeBytes) || sizeBytes < MIN_VOLUME_BYTES || sizeBytes > limits.maxSizeBytes) {
      const whose = limits.own.maxVolumeSizeGiB ? ` (the organisation's maxVolumeSizeGiB is ${org.limits.maxVolumeSizeGiB})` : '';
      throw errors.validation('sizeBytes', `must be an integer from ${MIN_VOLUME_BYTES} (64 MiB) to ${limits.maxSizeBytes}${whose}`);
    }
    // Rounded down to whole MiB (ext4 blocks); the limit the sandbox sees is a little less (metadata).
    const size = Math.floor(sizeBytes / MiB) * MiB;
    const host = await this.hosts.pickHost();
    const repo = volumeRepository(this.db);
    let volume: Volume;
    try {
      volume = await this.db.transaction(async (tx) => {
        await this.checkLimits(tx, principal.organizationId, size);
        return volumeRepository(tx).insertCreating({ id: newVolumeId(), organizationId: principal.organizationId, name: input.name, hostId: host.id, sizeBytes: size });
      });
    } catch (err) {
      if (/unique|duplicate/i.test(String((err as Error).message))) throw new NestboxError('conflict', `name: a volume named "${input.name}" already exists`, { field: 'name' });
      throw err;
    }
    try {
      await this.hosts.clientForRecord(host).ensureVolume(volume.id, size);
      return (await repo.update(volume.id, { state: 'ready' }))!;
    } catch (err) {
      const e = toNestboxError(err);
      // A failed create frees its name at once; the host removes what it may have made.
      await this.hosts.clientForRecord(host).deleteVolume(volume.id).catch(() => {});
      await repo.update(volume.id, { state: 'error', errorMessage: e.message, deletedAt: new Date() });
      throw e;
    }
  }

  /** Under the organisation's row lock (a limit changed meanwhile is seen; two creates take turns). */
  private async checkLimits(tx: DbOrTx, organizationId: string, sizeBytes: number): Promise<void> {
    const org = await organizationRepository(tx).lockById(organizationId);
    if (!org) throw errors.notFound('organization', organizationId);
    const limits = volumeLimitsOf(org.limits, this.limits);
    const used = await volumeRepository(tx).usageOf(organizationId);
    const retryAfterSeconds = this.limits.retryAfterSeconds;
    if (used.count + 1 > limits.maxVolumes) {
      const raise = limits.own.maxVolumes ? "the organisation's maxVolumes" : 'NESTBOX_ORG_MAX_VOLUMES';
      throw errors.quotaExceeded('volumes', `organisation limit reached: ${used.count} of ${limits.maxVolumes} volumes in use (delete some, or raise ${raise})`, { max: limits.maxVolumes, current: used.count, requested: 1, retryAfterSeconds });
    }
    if (used.bytes + sizeBytes > limits.maxTotalBytes) {
      const raise = limits.own.maxVolumeTotalGiB ? "the organisation's maxVolumeTotalGiB" : 'NESTBOX_ORG_MAX_VOLUME_GIB';
      throw errors.quotaExceeded('volumeBytes', `organisation limit reached: volumes of ${used.bytes} bytes of ${limits.maxTotalBytes} exist, this one needs ${sizeBytes} more (delete some, or raise ${raise})`, { max: limits.maxTotalBytes, current: used.bytes, requested: sizeBytes, retryAfterSeconds });
    }
  }

  async list(principal: Principal): Promise<Volume[]> {
    requireScope(principal, 'volumes:read');
    return volumeRepository(this.db).listLive(principal.organizationId);
  }

  /** By id; another organisation's volume is simply not found. */
  async get(principal: Principal, id: string): Promise<Volume> {
    requireScope(principal, 'volumes:read');
    const volume = typeof id === 'string' ? await volumeRepository(this.db).findLive(principal.organizationId, id) : undefined;
    if (!volume) throw errors.notFound('volume', id);
    return volume;
  }

  async getByName(principal: Principal, name: string): Promise<Volume> {
    requireScope(principal, 'volumes:read');
    const volume = typeof name === 'string' ? await volumeRepository(this.db).findLiveByName(principal.organizationId, name) : undefined;
    if (!volume) throw errors.notFound('volume', name);
    return volume;
  }

  async getByIdOrName(principal: Principal, idOrName: string): Promise<Volume> {
    requireScope(principal, 'volumes:read');
    const repo = volumeRepository(this.db);
    const volume = (await repo.findLive(principal.organizationId, idOrName)) ?? (await repo.findLiveByName(principal.organizationId, idOrName));
    if (!volume) throw errors.notFound('volume', idOrName);
    return volume;
  }

  /** Size limit and bytes used now, measured on its host. */
  async usage(principal: Principal, id: string): Promise<{ sizeBytes: number; usedBytes: number }> {
    const volume = await this.get(principal, id);
    const info = await (await this.hosts.clientFor(volume.hostId)).volumeInfo(volume.id);
    return { sizeBytes: info.sizeBytes, usedBytes: info.usedBytes };
  }

  /**
   * Refused (409 conflict, naming them) while a sandbox that is not deleted mounts it. The row
   * lock orders it against creates that mount it (they take the row FOR SHARE).
   */
  async delete(principal: Principal, id: string): Promise<void> {
    requireScope(principal, 'volumes:write');
    const volume = await this.get(principal, id);
    const repo = volumeRepository(this.db);
    await this.db.transaction(async (tx) => {
      const [locked] = await volumeRepository(tx).lock(principal.organizationId, [volume.id], 'update');
      if (!locked) throw errors.notFound('volume', id);
      const users = await volumeRepository(tx).mountedBy(volume.id);
      if (users.length) {
        throw new NestboxError('conflict', `volume ${volume.name} is mounted by ${users.length} sandbox(es) that are not deleted (${users.slice(0, 5).join(', ')}${users.length > 5 ? ', …' : ''}); delete them first`, { sandboxes: users });
      }
      await volumeRepository(tx).update(volume.id, { state: 'deleting' });
    });
    try {
      await (await this.hosts.clientFor(volume.hostId)).deleteVolume(volume.id);
    } catch (err) {
      // Left `deleting` and live: a retry deletes it (the host side is idempotent).
      throw toNestboxError(err);
    }
    await repo.update(volume.id, { deletedAt: new Date() });
  }

  /**
   * A create's `volumes`: checked, each volume found by id or name (404 otherwise) and ready,
   * all on one host. Outside any transaction; `lockForMount` re-checks under the rows' locks.
   */
  async resolveMounts(principal: Principal, inputs: unknown, field = 'volumes'): Promise<ResolvedMounts | undefined> {
    if (inputs === undefined || inputs === null) return undefined;
    if (!Array.isArray(inputs)) throw errors.validation(field, 'must be an array');
    if (inputs.length === 0) return undefined;
    requireScope(principal, 'volumes:read');
    if (inputs.length > MAX_VOLUME_MOUNTS) throw errors.validation(field, `at most ${MAX_VOLUME_MOUNTS} mounts`);
    const mounts: SandboxVolumeMount[] = [];
    const volumes: Volume[] = [];
    const paths = new Set<string>();
    for (const [index, raw] of (inputs as VolumeMountInput[]).entries()) {
      const at = `${field}[${index}]`;
      if (!raw || typeof raw !== 'object') throw errors.validation(at, 'must be an object');
      const ref = raw.volumeId ?? raw.name;
      if (typeof ref !== 'string' || ref === '') throw errors.validation(`${at}.volumeId`, 'a volume id or name is required');
      const problem = pathProblem(raw.mountPath, 'mountPath');
      if (problem) throw errors.validation(`${at}.mountPath`, problem);
      if (raw.subpath !== undefined && raw.subpath !== null && raw.subpath !== '') {
        const sub = pathProblem(raw.subpath, 'subpath');
        if (sub) throw errors.validation(`${at}.subpath`, sub);
      }
      if (raw.readOnly !== undefined && typeof raw.readOnly !== 'boolean') throw errors.validation(`${at}.readOnly`, 'must be true or false');
      const mountPath = normalPath(raw.mountPath);
      if (paths.has(mountPath)) throw errors.validation(`${at}.mountPath`, `${mountPath} is mounted twice`);
      paths.add(mountPath);
      const repo = volumeRepository(this.db);
      const volume = raw.volumeId !== undefined ? ((await repo.findLive(principal.organizationId, ref)) ?? (await repo.findLiveByName(principal.organizationId, ref))) : await repo.findLiveByName(principal.organizationId, ref);
      if (!volume) throw new NestboxError('not_found', `${at}: volume ${ref} not found`, { kind: 'volume', id: ref, field: at });
      if (volume.state !== 'ready') throw new NestboxError('invalid_state', `${at}: volume ${volume.name} is ${volume.state}, not ready`, { kind: 'volume', id: volume.id, state: volume.state });
      volumes.push(volume);
      const subpath = typeof raw.subpath === 'string' && raw.subpath.split('/').some(Boolean) ? raw.subpath.split('/').filter(Boolean).join('/') : undefined;
      mounts.push({ volumeId: volume.id, name: volume.name, mountPath, readOnly: raw.readOnly === true, ...(subpath ? { subpath } : {}) });
    }
    const hostIds = [...new Set(volumes.map((v) => v.hostId))];
    if (hostIds.length > 1) throw errors.validation(field, `the volumes are on different hosts (${volumes.map((v) => `${v.name}: ${v.hostId}`).join(', ')}); a sandbox can only mount volumes of one host`);
    return { mounts, hostId: hostIds[0]!, what: `volume ${volumes.map((v) => v.name).join(', ')}` };
  }

  /** Inside a sandbox create's transaction: the volumes still exist and are ready, and stay so until it commits. */
  async lockForMount(tx: DbOrTx, organizationId: string, resolved: ResolvedMounts): Promise<void> {
    const ids = [...new Set(resolved.mounts.map((m) => m.volumeId))];
    const locked = await volumeRepository(tx).lock(organizationId, ids, 'share');
    for (const id of ids) {
      const volume = locked.find((v) => v.id === id);
      if (!volume || volume.state !== 'ready') throw new NestboxError('conflict', `volume ${resolved.mounts.find((m) => m.volumeId === id)!.name} was deleted or is being deleted`, { kind: 'volume', id });
    }
  }

  /**
   * A file operation on a volume's contents on its host (host/agent/volume-files.ts); reads need
   * `volumes:read`, changes `volumes:write`. The host's answer is returned as it came.
   */
  async files(principal: Principal, id: string, o: { method: string; op: string; query: Record<string, string>; body?: Readable; json?: unknown }): Promise<IncomingMessage> {
    const volume = await this.get(principal, id);
    if (o.method !== 'GET') requireScope(principal, 'volumes:write');
    return (await this.hosts.clientFor(volume.hostId)).volumeFiles(volume.id, o);
  }
}

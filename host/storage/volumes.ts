// Persistent named volumes on a host (issue 19). A volume is a file system of its own, like a
// sandbox disk (disk-quota.ts): an ext4 in a sparse `<volumesDir>/<id>/disk.img` of the
// volume's size limit, loop-mounted at `<volumesDir>/<id>/fs`. Its contents are under
// `fs/data` (so ext4's lost+found is not part of it), with unshifted ids: uid 0 on disk is
// root in every sandbox that mounts it (drivers attach an idmapped clone per sandbox), so
// several sandboxes with different id ranges share it and see each other's files as their own.
// Writes beyond the size fail with ENOSPC inside sandboxes; `df` on the mount shows the limit.
// The image stays mounted while the volume exists (mounted again after a reboot by `ensure`),
// so a volume outlives every sandbox and the host agent serves its files with none running.
import { existsSync } from 'node:fs';
import { chmod, mkdir, readdir, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { createDiskImage, diskImagePath, diskMountPoint, inodesFor, MIN_DISK_BYTES, mountDiskImage, readDiskUsage, unmountDiskImage } from './disk-quota.js';
import { isMountPoint } from '../util/mounts.js';

/** Volume ids become directory names. */
export const VOLUME_ID_PATTERN = /^[a-z0-9][a-z0-9-]{0,63}$/;
export const MIN_VOLUME_BYTES = MIN_DISK_BYTES;
/** Inodes per GiB of a volume (the same density as sandbox disks' default). */
const INODES_PER_GIB = 65_536;
const DATA_DIR = 'data';

export interface VolumeUsage {
  sizeBytes: number;
  usedBytes: number;
}

export class VolumeStore {
  constructor(readonly dir: string) {}

  private volumeDir(id: string): string {
    if (!VOLUME_ID_PATTERN.test(id)) throw new Error(`invalid volume id "${id}"`);
    return join(this.dir, id);
  }

  /** Host path of the volume's contents (mounted); what sandboxes see at their mount path. */
  dataDir(id: string): string {
    return join(diskMountPoint(this.volumeDir(id)), DATA_DIR);
  }

  exists(id: string): boolean {
    return existsSync(diskImagePath(this.volumeDir(id)));
  }

  /**
   * Creates the volume if it does not exist yet and mounts it if it is not (idempotent: a retry
   * after a crash, a reboot, a host-agent restart). An image left half-made is never renamed into
   * place (createDiskImage), so existing means complete.
   */
  async ensure(id: string, sizeBytes?: number): Promise<void> {
    const dir = this.volumeDir(id);
    if (!this.exists(id)) {
      if (sizeBytes === undefined) throw new Error(`volume ${id} does not exist on this host`);
      await mkdir(dir, { recursive: true, mode: 0o700 });
      await createDiskImage(dir, { sizeBytes, inodes: inodesFor(sizeBytes, INODES_PER_GIB) }, { nodevNosuid: true });
    } else {
      await mountDiskImage(dir, { nodevNosuid: true });
    }
    // The top is open to every user (0777), whatever uid a sandbox's processes run as (Daytona's
    // `daytona`, E2B's `user`, root), as those services' volumes are.
    const data = this.dataDir(id);
    if (!existsSync(data)) {
      await mkdir(data, { mode: 0o777 });
      await chmod(data, 0o777);
    }
  }

  async usage(id: string): Promise<VolumeUsage> {
    await this.ensure(id);
    return readDiskUsage(this.volumeDir(id));
  }

  /** Unmounts and removes the volume (idempotent). The caller makes sure no sandbox mounts it. */
  async destroy(id: string): Promise<void> {
    const dir = this.volumeDir(id);
    await unmountDiskImage(dir);
    await rm(dir, { recursive: true, force: true });
  }

  async list(): Promise<string[]> {
    if (!existsSync(this.dir)) return [];
    const names = await readdir(this.dir);
    const ids: string[] = [];
    for (const name of names) if (VOLUME_ID_PATTERN.test(name) && existsSync(diskImagePath(join(this.dir, name)))) ids.push(name);
    return ids;
  }

  isMounted(id: string): boolean {
    return isMountPoint(diskMountPoint(this.volumeDir(id)));
  }

  /** Size of the image file on the host (what the volume really takes there; it is sparse). */
  async hostBytes(id: string): Promise<number> {
    const info = await stat(diskImagePath(this.volumeDir(id)));
    return info.blocks * 512;
  }
}

/** Volume mount paths and subpaths: plain components only, so they travel safely through stage 2. */
const VOLUME_PATH_COMPONENT = /^[A-Za-z0-9_@+=,.~-]{1,255}$/;
const RESERVED_MOUNT_ROOTS = new Set(['proc', 'sys', 'dev', '.nestbox']);

/** Why a volume mount path (absolute) or subpath (relative) is refused, or undefined if fine. */
export function volumePathProblem(path: string, kind: 'mountPath' | 'subpath'): string | undefined {
  if (kind === 'mountPath' && !path.startsWith('/')) return 'must be an absolute path';
  const parts = path.split('/').filter((part) => part !== '');
  if (kind === 'mountPath' && parts.length === 0) return 'cannot be /';
  if (path.length > 1024) return 'must be at most 1024 characters';
  for (const part of parts) {
    if (part === '.' || part === '..') return "must not contain '.' or '..' components";
    if (!VOLUME_PATH_COMPONENT.test(part)) return "may only contain letters, digits and _@+=,.~- between slashes";
  }
  if (kind === 'mountPath' && RESERVED_MOUNT_ROOTS.has(parts[0]!)) return `cannot be under /${parts[0]} (the sandbox's own)`;
  return undefined;
}

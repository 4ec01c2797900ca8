// Named snapshots (templates): a sandbox's disk saved as an immutable overlay layer under
// `<store>/snapshots/<snapshotId>/layer/` with `meta.json` beside it. A sandbox created from a
// snapshot mounts `lowerdir=<layer>:<parent layers…>:<base rootfs>` with a fresh upper dir, so
// nothing is copied at create. A snapshot taken of such a sandbox lists the chain in `parents`.
//
// A snapshot of a sandbox with its own disk (disk-quota.ts) is a clone of that disk's image,
// `<snapshotId>/disk.img`, mounted read-only at `<snapshotId>/fs`; its layer is `fs/upper`. On
// the reflink store the clone shares the sandbox's blocks, so a snapshot of a full disk costs
// metadata only, and it can never be larger than the disk limit of the sandbox it was taken of.
//
// Crash safety: a snapshot is built in `.tmp-<id>-<random>/` and published with one rename, and
// deleted by renaming it to `.trash-…` first; `init()` removes whatever such names a crash left.
// Snapshot ids start with a letter or digit, so they never collide with those names.
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, readFile, readdir, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { removeTree } from '../util/fs.js';
import { DriverError } from '../drivers/errors.js';
import { treeSizeBytes, type DiskCopyMode } from './disk-store.js';
import { DISK_IMAGE_FILE, diskMountPoint, mountDiskImage } from './disk-quota.js';

/** Letters, digits, `_`, `.`, `-`; no `:` or `,` (they would split overlay mount options). */
export const SNAPSHOT_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
const META_FILE = 'meta.json';
const META_VERSION = 1;

export interface SnapshotMeta {
  version: number;
  snapshotId: string;
  /** The sandbox the snapshot was taken of (it may be gone by now). */
  sourceId: string;
  /** The base image at the bottom of the chain. */
  image: string;
  /** Snapshot ids below this one, topmost first (empty for a snapshot of a plain sandbox). */
  parents: string[];
  createdAt: string;
  /** Apparent size of this layer's files (not counting parents or the base image). */
  sizeBytes: number;
  diskCopy: DiskCopyMode;
}

export function assertSnapshotId(snapshotId: string): void {
  if (typeof snapshotId !== 'string' || !SNAPSHOT_ID.test(snapshotId)) {
    throw new DriverError('validation_failed', `invalid snapshot id "${snapshotId}": 1-64 letters, digits, '_', '.' or '-', starting with a letter or digit`);
  }
}

export class SnapshotStore {
  constructor(readonly dir: string) {}

  async init(): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o700 });
    for (const entry of await readdir(this.dir)) {
      if (entry.startsWith('.tmp-') || entry.startsWith('.trash-')) await removeTree(join(this.dir, entry));
      // After a reboot a disk-image snapshot is a file again (a no-op while it is mounted).
      else if (existsSync(join(this.dir, entry, DISK_IMAGE_FILE))) await mountDiskImage(join(this.dir, entry), { readOnly: true });
    }
  }

  layerDir(snapshotId: string): string {
    const dir = join(this.dir, snapshotId);
    return existsSync(join(dir, DISK_IMAGE_FILE)) ? join(diskMountPoint(dir), 'upper') : join(dir, 'layer');
  }

  async get(snapshotId: string): Promise<SnapshotMeta | undefined> {
    if (!SNAPSHOT_ID.test(snapshotId)) return undefined;
    try {
      const meta = JSON.parse(await readFile(join(this.dir, snapshotId, META_FILE), 'utf8')) as SnapshotMeta;
      return meta.version === META_VERSION ? meta : undefined;
    } catch {
      return undefined;
    }
  }

  async list(): Promise<SnapshotMeta[]> {
    const entries = await readdir(this.dir).catch(() => [] as string[]);
    const metas: SnapshotMeta[] = [];
    for (const entry of entries.sort()) {
      const meta = await this.get(entry);
      if (meta) metas.push(meta);
    }
    return metas;
  }

  /**
   * Builds a snapshot: `fill(layerDir)` writes the layer (layerDir does not exist yet) or a
   * disk image beside it (`disk.img`, then mounted read-only), then the meta is written and the
   * whole directory appears under its name in one rename.
   */
  async create(
    meta: Omit<SnapshotMeta, 'version' | 'createdAt' | 'sizeBytes'>,
    fill: (layerDir: string) => Promise<void>,
  ): Promise<SnapshotMeta> {
    const temp = join(this.dir, `.tmp-${meta.snapshotId}-${randomBytes(4).toString('hex')}`);
    await mkdir(temp, { mode: 0o700 });
    try {
      let layer = join(temp, 'layer');
      await fill(layer);
      if (existsSync(join(temp, DISK_IMAGE_FILE))) {
        await mountDiskImage(temp, { readOnly: true });
        layer = join(diskMountPoint(temp), 'upper');
      }
      const full: SnapshotMeta = { version: META_VERSION, ...meta, createdAt: new Date().toISOString(), sizeBytes: await treeSizeBytes(layer) };
      await writeFile(join(temp, META_FILE), `${JSON.stringify(full, null, 2)}\n`, { mode: 0o600 });
      try {
        await rename(temp, join(this.dir, meta.snapshotId));
      } catch (error) {
        const code = (error as NodeJS.ErrnoException).code;
        if (code === 'ENOTEMPTY' || code === 'EEXIST') throw new DriverError('conflict', `snapshot ${meta.snapshotId} already exists`);
        throw error;
      }
      return full;
    } catch (error) {
      await removeTree(temp).catch(() => {});
      throw error;
    }
  }

  /**
   * The entries a transfer sends (transfer.ts): the meta and either the layer dir or the disk
   * image (not its read-only mount, which the receiving host mounts itself).
   */
  transferEntries(snapshotId: string): string[] {
    return [META_FILE, existsSync(join(this.dir, snapshotId, DISK_IMAGE_FILE)) ? DISK_IMAGE_FILE : 'layer'];
  }

  /**
   * Takes in a snapshot sent by another host: `fill(tempDir)` unpacks what transferEntries
   * named into a `.tmp-` dir, then it is checked (its meta names this snapshot), a disk image
   * is mounted read-only, and it appears under its name in one rename, as create() does. A
   * crash or failure half-way leaves only a `.tmp-` name, which init() removes.
   */
  async adopt(snapshotId: string, fill: (tempDir: string) => Promise<void>): Promise<SnapshotMeta> {
    assertSnapshotId(snapshotId);
    const temp = join(this.dir, `.tmp-${snapshotId}-${randomBytes(4).toString('hex')}`);
    await mkdir(temp, { mode: 0o700 });
    try {
      await fill(temp);
      const meta = JSON.parse(await readFile(join(temp, META_FILE), 'utf8')) as SnapshotMeta;
      if (meta.version !== META_VERSION || meta.snapshotId !== snapshotId) throw new DriverError('validation_failed', `the transferred snapshot is not ${snapshotId} (meta names ${String(meta.snapshotId)})`);
      if (existsSync(join(temp, DISK_IMAGE_FILE))) await mountDiskImage(temp, { readOnly: true });
      else if (!existsSync(join(temp, 'layer'))) throw new DriverError('validation_failed', `the transferred snapshot ${snapshotId} has neither a layer nor a disk image`);
      try {
        await rename(temp, join(this.dir, snapshotId));
      } catch (error) {
        const code = (error as NodeJS.ErrnoException).code;
        if (code === 'ENOTEMPTY' || code === 'EEXIST') throw new DriverError('conflict', `snapshot ${snapshotId} already exists`);
        throw error;
      }
      return meta;
    } catch (error) {
      await removeTree(temp).catch(() => {});
      throw error;
    }
  }

  /** Removes a snapshot; a missing one is fine. Reference checks are the caller's job. */
  async remove(snapshotId: string): Promise<void> {
    const trash = join(this.dir, `.trash-${snapshotId}-${randomBytes(4).toString('hex')}`);
    try {
      await rename(join(this.dir, snapshotId), trash);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === 'ENOENT') return;
      throw error;
    }
    await removeTree(trash);
  }
}

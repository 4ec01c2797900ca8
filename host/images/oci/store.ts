// The OCI image store: images pulled from registries with skopeo, unpacked with umoci into root
// filesystems the local driver mounts as its bottom overlay layer (as it does the base image).
//
// Layout under the store dir (one file system, so the final rename is atomic):
//   images/<hex>/rootfs/      the unpacked tree, ownership as in the image (root stays 0: the
//                             driver's idmapped mounts shift it, as for the base image)
//   images/<hex>/image.json   what the image is (digest, source, layers, config); written before
//                             the rename, so an image dir that exists is complete
//   tmp/<hex>-<pid>-<rand>/   a pull in progress (OCI layout + rootfs), renamed onto images/<hex>
//   locks/<hex>.lock          one puller per digest (pid + start time, base-image.ts's lock)
//   registries.conf, policy.json  skopeo's configuration, written from ours at open
//   blobs/sha256/<hex>        the layer cache: every compressed layer pulled, by its digest.
//                             A pull hard-links the ones it needs into its layout first, and
//                             skopeo reuses a blob a layout already has instead of fetching it;
//                             the new ones are linked in afterwards. Removing an image removes
//                             the blobs no other image lists.
//
// <hex> is the sha256 of the image's linux/amd64 manifest as the registry serves it: the same
// image under two tags, or pulled twice, is one copy. A kill -9 mid-pull leaves only tmp/ and a
// stale lock, both swept by the next puller of that digest (and tmp/ at open).
import { createHash, randomBytes } from 'node:crypto';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, link, lstat, mkdir, mkdtemp, readdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { z } from 'zod';
import type { HostImageConfig } from '../../../core/host-client.js';
import { removeTree, writeFileAtomic } from '../../util/fs.js';
import { acquireBuildLock } from '../base-image.js';
import { ImageError } from './errors.js';
import { DIGEST, formatImageReference, parseImageReference, type ImageReference } from './reference.js';
import { renderPolicy, renderRegistriesConf, type RegistryConfig } from './registries.js';
import { runTool } from './tools.js';

const execFileAsync = promisify(execFile);

export const PLATFORM = { os: 'linux', architecture: 'amd64' } as const;
const DEFAULT_PULL_TIMEOUT_MS = 30 * 60_000;
const DEFAULT_INSPECT_TIMEOUT_MS = 60_000;
const DEFAULT_LOCK_WAIT_MS = 30 * 60_000;
const LAYOUT_TAG = 'image';
/** Docker's empty base image's name (`FROM scratch`): made by the store, never pulled. */
export const SCRATCH = 'scratch';
/** An image id: the manifest digest. */
export const IMAGE_ID = DIGEST;

export interface RegistryCredentials {
  username: string;
  password: string;
}

export interface OciImageStoreOptions extends RegistryConfig {
  storeDir: string;
  /** Bounds every skopeo copy and umoci unpack (default 30 min). */
  pullTimeoutMs?: number;
  /** Bounds manifest look-ups (default 60 s). */
  inspectTimeoutMs?: number;
  /** How long a second puller of one digest waits for the first (default 30 min). */
  lockWaitMs?: number;
  skopeoBinary?: string;
  umociBinary?: string;
}

export interface PullOptions {
  credentials?: RegistryCredentials;
  onProgress?: (line: string) => void;
  signal?: AbortSignal;
}

/** What an OCI image's config says processes start with: core's wire type (one declaration). */
export type OciImageConfig = HostImageConfig;

export interface OciImageMeta {
  /** `sha256:<hex>` of the linux/amd64 manifest. */
  id: string;
  /** The normalised reference it was first pulled as. */
  reference: string;
  source: { registry: string; repository: string; tag?: string; digest?: string; indexDigest?: string };
  platform: string;
  pulledAt: string;
  pullMs: number;
  /** Bytes of the unpacked root filesystem. */
  sizeBytes: number;
  /** Bytes of the layers as the registry sends them. */
  compressedBytes: number;
  layers: { digest: string; size: number; mediaType: string }[];
  created?: string;
  config: OciImageConfig;
  /** Device nodes the image carried, removed at unpack (paths inside the image). */
  removedDeviceNodes: string[];
}

export interface OciImage {
  meta: OciImageMeta;
  rootfs: string;
  /** false when the digest was already in the store (nothing was copied). */
  pulled: boolean;
}

// The parts of manifests and configs we read (skopeo fetches them; zod keeps us honest).
const Descriptor = z.object({ mediaType: z.string().optional(), digest: z.string().regex(DIGEST), size: z.number().int().nonnegative() });
const ManifestList = z.object({
  manifests: z.array(Descriptor.extend({ platform: z.object({ os: z.string(), architecture: z.string(), variant: z.string().optional() }).optional() })),
});
const ImageManifest = z.object({ config: Descriptor, layers: z.array(Descriptor) });
const ImageConfig = z.object({
  created: z.string().optional(),
  config: z
    .object({
      Env: z.array(z.string()).nullish(),
      Cmd: z.array(z.string()).nullish(),
      Entrypoint: z.array(z.string()).nullish(),
      WorkingDir: z.string().nullish(),
      User: z.string().nullish(),
      ExposedPorts: z.record(z.string(), z.unknown()).nullish(),
      Labels: z.record(z.string(), z.string()).nullish(),
    })
    .nullish(),
});

export class OciImageStore {
  private readonly options: OciImageStoreOptions;
  private readonly imagesDir: string;
  private readonly tmpDir: string;
  private readonly locksDir: string;
  private readonly blobsDir: string;
  private opened = false;

  constructor(options: OciImageStoreOptions) {
    this.options = options;
    this.imagesDir = join(options.storeDir, 'images');
    this.tmpDir = join(options.storeDir, 'tmp');
    this.locksDir = join(options.storeDir, 'locks');
    this.blobsDir = join(options.storeDir, 'blobs', 'sha256');
  }

  /** Creates the layout, writes skopeo's configuration and sweeps pulls whose process died. */
  async open(): Promise<this> {
    if (this.opened) return this;
    for (const dir of [this.options.storeDir, this.imagesDir, this.tmpDir, this.locksDir, this.blobsDir]) await mkdir(dir, { recursive: true, mode: 0o700 });
    await writeFileAtomic(join(this.options.storeDir, 'policy.json'), renderPolicy());
    for (const entry of await readdir(this.tmpDir)) {
      const pid = Number(/^[a-f0-9]{64}-(\d+)-/.exec(entry)?.[1]);
      if (!pid || !existsSync(`/proc/${pid}`)) await removeTree(join(this.tmpDir, entry));
    }
    this.opened = true;
    return this;
  }

  /** The image with this id (`sha256:<hex>`), when it is in the store. */
  async get(id: string): Promise<OciImage | undefined> {
    if (!IMAGE_ID.test(id)) return undefined;
    const dir = join(this.imagesDir, hexOf(id));
    try {
      const meta = JSON.parse(await readFile(join(dir, 'image.json'), 'utf8')) as OciImageMeta;
      if (!(await stat(join(dir, 'rootfs'))).isDirectory()) return undefined;
      return { meta, rootfs: join(dir, 'rootfs'), pulled: false };
    } catch {
      return undefined;
    }
  }

  async list(): Promise<OciImageMeta[]> {
    const images: OciImageMeta[] = [];
    for (const entry of await readdir(this.imagesDir).catch(() => [])) {
      const image = await this.get(`sha256:${entry}`);
      if (image) images.push(image.meta);
    }
    return images;
  }

  /** Removes an image (the caller makes sure nothing uses it). Idempotent. */
  async remove(id: string): Promise<void> {
    if (!IMAGE_ID.test(id)) throw new ImageError('validation_failed', `image id "${id}" must be sha256: followed by 64 hex digits`);
    const dir = join(this.imagesDir, hexOf(id));
    if (!existsSync(dir)) return;
    // Renamed away first: a half-removed tree must never look like an image.
    const doomed = join(this.tmpDir, `${hexOf(id)}-${process.pid}-rm-${randomBytes(4).toString('hex')}`);
    await rename(dir, doomed);
    await removeTree(doomed);
    // Cached layers no remaining image lists go with it (a pull racing this only loses reuse).
    const listed = new Set((await this.list()).flatMap((image) => image.layers.map((layer) => hexOf(layer.digest))));
    for (const blob of await readdir(this.blobsDir).catch(() => [] as string[])) if (!listed.has(blob)) await rm(join(this.blobsDir, blob), { force: true });
  }

  /**
   * Pulls `reference` (linux/amd64 of a manifest list), unless its digest is already here.
   * Concurrent pulls of one digest make one copy; the second waits for the first.
   */
  async pull(reference: string, options: PullOptions = {}): Promise<OciImage> {
    await this.open();
    if (reference === SCRATCH) return this.scratch(options.onProgress ?? (() => {}));
    const ref = parseImageReference(reference);
    const progress = options.onProgress ?? (() => {});
    const auth = await this.authDir(ref, options.credentials);
    try {
      const resolved = await this.resolve(ref, auth, options.signal);
      const existing = await this.get(resolved.id);
      if (existing) {
        progress(`${formatImageReference(ref)}: ${resolved.id} is already in the store`);
        return existing;
      }
      const hex = hexOf(resolved.id);
      const release = await acquireBuildLock(join(this.locksDir, `${hex}.lock`), this.options.lockWaitMs ?? DEFAULT_LOCK_WAIT_MS);
      try {
        const meanwhile = await this.get(resolved.id);
        if (meanwhile) return meanwhile;
        // Only the lock holder writes tmp/<hex>-*: what is there now is a dead puller's.
        for (const entry of await readdir(this.tmpDir)) if (entry.startsWith(`${hex}-`)) await removeTree(join(this.tmpDir, entry));
        return await this.pullLocked(ref, resolved, auth, progress, options.signal);
      } finally {
        await release();
      }
    } finally {
      await auth.cleanup();
    }
  }

  /**
   * Docker's `FROM scratch`: an image with no layers, made here with umoci (never pulled), once
   * per store. Its tree is only the mount points and /tmp a sandbox needs.
   */
  private async scratch(progress: (line: string) => void): Promise<OciImage> {
    const marker = join(this.options.storeDir, 'scratch-id');
    const known = await readFile(marker, 'utf8').then((id) => this.get(id.trim()), () => undefined);
    if (known) return known;
    const release = await acquireBuildLock(join(this.locksDir, 'scratch.lock'), this.options.lockWaitMs ?? DEFAULT_LOCK_WAIT_MS);
    try {
      const again = await readFile(marker, 'utf8').then((id) => this.get(id.trim()), () => undefined);
      if (again) return again;
      const started = Date.now();
      const work = join(this.tmpDir, `${'0'.repeat(64)}-${process.pid}-${randomBytes(4).toString('hex')}`);
      await mkdir(work, { mode: 0o700 });
      try {
        const layout = join(work, 'layout');
        await runTool(this.options.umociBinary ?? 'umoci', ['init', '--layout', layout], { timeoutMs: DEFAULT_INSPECT_TIMEOUT_MS });
        await runTool(this.options.umociBinary ?? 'umoci', ['new', '--image', `${layout}:${LAYOUT_TAG}`], { timeoutMs: DEFAULT_INSPECT_TIMEOUT_MS });
        const index = JSON.parse(await readFile(join(layout, 'index.json'), 'utf8')) as { manifests: { digest: string }[] };
        const id = index.manifests[0]!.digest;
        const rootfs = join(work, 'rootfs');
        await mkdir(rootfs, { mode: 0o755 });
        await prepareTreeForSandboxes(rootfs, '');
        const meta: OciImageMeta = {
          id,
          reference: SCRATCH,
          source: { registry: '', repository: SCRATCH },
          platform: `${PLATFORM.os}/${PLATFORM.architecture}`,
          pulledAt: new Date().toISOString(),
          pullMs: Date.now() - started,
          sizeBytes: 0,
          compressedBytes: 0,
          layers: [],
          config: { env: [], cmd: null, entrypoint: null, workingDir: '', user: '', exposedPorts: [], labels: {} },
          removedDeviceNodes: [],
        };
        const staged = join(work, 'image');
        await mkdir(staged, { mode: 0o755 });
        await rename(rootfs, join(staged, 'rootfs'));
        await writeFile(join(staged, 'image.json'), `${JSON.stringify(meta, null, 2)}\n`, { mode: 0o644 });
        await rename(staged, join(this.imagesDir, hexOf(id)));
        await writeFileAtomic(marker, `${id}\n`);
        progress(`scratch: an empty image ${id}`);
        return { meta, rootfs: join(this.imagesDir, hexOf(id), 'rootfs'), pulled: true };
      } finally {
        await removeTree(work);
      }
    } finally {
      await release();
    }
  }

  // ---- steps ------------------------------------------------------------------------------------

  /** The platform manifest's digest: a list is resolved to linux/amd64 by reading it. */
  private async resolve(ref: ImageReference, auth: SkopeoAuth, signal?: AbortSignal): Promise<{ id: string; indexDigest?: string; manifest: z.infer<typeof ImageManifest> }> {
    const target = `docker://${formatImageReference(ref)}`;
    const raw = await this.skopeo(['inspect', '--raw', ...auth.args, target], auth.registriesConf, this.options.inspectTimeoutMs ?? DEFAULT_INSPECT_TIMEOUT_MS, signal);
    const digest = `sha256:${createHash('sha256').update(raw).digest('hex')}`;
    const parsed = parseJson(raw, target);
    const list = ManifestList.safeParse(parsed);
    if (list.success && Array.isArray((parsed as { manifests?: unknown }).manifests)) {
      const entry = list.data.manifests.find((m) => m.platform?.os === PLATFORM.os && m.platform.architecture === PLATFORM.architecture);
      if (!entry) throw new ImageError('not_found', `${formatImageReference(ref)} has no ${PLATFORM.os}/${PLATFORM.architecture} image (platforms: ${list.data.manifests.map((m) => `${m.platform?.os}/${m.platform?.architecture}`).join(', ')})`);
      const pinned = { ...ref, tag: undefined, digest: entry.digest };
      const inner = await this.skopeo(['inspect', '--raw', ...auth.args, `docker://${formatImageReference(pinned)}`], auth.registriesConf, this.options.inspectTimeoutMs ?? DEFAULT_INSPECT_TIMEOUT_MS, signal);
      return { id: entry.digest, indexDigest: digest, manifest: parseManifest(inner, target) };
    }
    if (ref.digest && ref.digest !== digest) throw new ImageError('internal', `${target}: the registry sent a manifest with digest ${digest}`);
    return { id: digest, manifest: parseManifest(raw, target) };
  }

  private async pullLocked(
    ref: ImageReference,
    resolved: { id: string; indexDigest?: string; manifest: z.infer<typeof ImageManifest> },
    auth: SkopeoAuth,
    progress: (line: string) => void,
    signal?: AbortSignal,
  ): Promise<OciImage> {
    const started = Date.now();
    const hex = hexOf(resolved.id);
    const work = join(this.tmpDir, `${hex}-${process.pid}-${randomBytes(4).toString('hex')}`);
    const timeoutMs = this.options.pullTimeoutMs ?? DEFAULT_PULL_TIMEOUT_MS;
    await mkdir(work, { mode: 0o700 });
    try {
      const pinned = formatImageReference({ ...ref, tag: undefined, digest: resolved.id });
      const layout = `oci:${join(work, 'layout')}:${LAYOUT_TAG}`;
      const compressed = resolved.manifest.layers.reduce((sum, layer) => sum + layer.size, 0);
      progress(`${formatImageReference(ref)}: copying ${resolved.id} (${resolved.manifest.layers.length} layers, ${compressed} bytes)`);
      // umoci 0.4.7 (Debian 12) reads gzip and plain tar layers only: zstd ones are recompressed
      // by skopeo on the way into the layout (the recorded layers stay the registry's).
      const zstd = resolved.manifest.layers.some((layer) => layer.mediaType?.includes('zstd'));
      const recompress = zstd ? ['--dest-compress', '--dest-compress-format', 'gzip'] : [];
      // The layer cache: layers this store already has are linked into the layout, where skopeo
      // finds them and fetches only the rest. (Recompressed layers get new digests: no reuse.)
      const layoutBlobs = join(work, 'layout', 'blobs', 'sha256');
      await mkdir(layoutBlobs, { recursive: true, mode: 0o700 });
      const cached = new Map<string, number>();
      if (!zstd) {
        for (const layer of resolved.manifest.layers) {
          const blob = hexOf(layer.digest);
          if (await link(join(this.blobsDir, blob), join(layoutBlobs, blob)).then(() => true, () => false)) cached.set(blob, (await stat(join(layoutBlobs, blob))).ino);
        }
      }
      await this.skopeo(['copy', '--quiet', ...auth.args.map((arg) => arg.replace(/^--/, '--src-')), '--override-os', PLATFORM.os, '--override-arch', PLATFORM.architecture, ...recompress, `docker://${pinned}`, layout], auth.registriesConf, timeoutMs, signal);
      // A cached layer skopeo reused is still the same inode; one it fetched again is not.
      let reused = 0;
      for (const [blob, ino] of cached) if ((await stat(join(layoutBlobs, blob)).catch(() => undefined))?.ino === ino) reused++;
      progress(`${formatImageReference(ref)}: ${reused} of ${resolved.manifest.layers.length} layers from the layer cache`);
      for (const layer of resolved.manifest.layers) {
        const blob = hexOf(layer.digest);
        if (!cached.has(blob)) await link(join(layoutBlobs, blob), join(this.blobsDir, blob)).catch(() => undefined);
      }
      const config = ImageConfig.parse(parseJson(await this.skopeo(['inspect', '--config', layout], auth.registriesConf, timeoutMs, signal), layout));
      progress(`${formatImageReference(ref)}: unpacking`);
      // As root, umoci keeps the image's owners and modes and turns whiteouts and opaque
      // directories into deletions while it applies the layers in order. `raw unpack` makes the
      // root filesystem only: no runtime bundle and no mtree (a checksum of every file, which
      // took most of the time of a 190 MB image's pull).
      const rootfs = join(work, 'rootfs');
      await runTool(this.options.umociBinary ?? 'umoci', ['raw', 'unpack', '--image', `${join(work, 'layout')}:${LAYOUT_TAG}`, rootfs], { timeoutMs, signal });
      const imageConfig = imageConfigOf(config);
      const removedDevices = await removeDeviceNodes(rootfs, timeoutMs);
      if (removedDevices.length) progress(`${formatImageReference(ref)}: removed ${removedDevices.length} device nodes (${removedDevices.slice(0, 5).join(', ')}${removedDevices.length > 5 ? ', …' : ''})`);
      await prepareTreeForSandboxes(rootfs, imageConfig.workingDir);
      const meta: OciImageMeta = {
        id: resolved.id,
        reference: formatImageReference(ref),
        source: { registry: ref.registry, repository: ref.repository, tag: ref.tag, digest: ref.digest, indexDigest: resolved.indexDigest },
        platform: `${PLATFORM.os}/${PLATFORM.architecture}`,
        pulledAt: new Date().toISOString(),
        pullMs: Date.now() - started,
        sizeBytes: await diskUsageBytes(rootfs),
        compressedBytes: compressed,
        layers: resolved.manifest.layers.map((layer) => ({ digest: layer.digest, size: layer.size, mediaType: layer.mediaType ?? '' })),
        created: config.created,
        config: imageConfig,
        removedDeviceNodes: removedDevices,
      };
      // The finished image dir is assembled in tmp/ and renamed in one step.
      const staged = join(work, 'image');
      await mkdir(staged, { mode: 0o755 });
      await rename(rootfs, join(staged, 'rootfs'));
      await writeFile(join(staged, 'image.json'), `${JSON.stringify(meta, null, 2)}\n`, { mode: 0o644 });
      await rename(staged, join(this.imagesDir, hex));
      progress(`${formatImageReference(ref)}: ${resolved.id} ready in ${meta.pullMs} ms (${meta.sizeBytes} bytes unpacked)`);
      return { meta, rootfs: join(this.imagesDir, hex, 'rootfs'), pulled: true };
    } finally {
      await removeTree(work);
    }
  }

  /**
   * Credentials go to skopeo in an auth file (mode 0600, in a private temp dir), never in argv
   * where every user of the host could read them; without any, skopeo is told to use none, so it
   * never picks up whatever the host's root has logged in to.
   */
  private async authDir(ref: ImageReference, credentials: RegistryCredentials | undefined): Promise<SkopeoAuth> {
    const registriesConf = await this.registriesConf(ref);
    if (!credentials) return { registriesConf, args: ['--no-creds'], cleanup: async () => {} };
    if (typeof credentials.username !== 'string' || typeof credentials.password !== 'string' || credentials.username.includes(':')) {
      throw new ImageError('validation_failed', 'credentials: username (without ":") and password are required');
    }
    const dir = await mkdtemp(join(tmpdir(), 'nestbox-auth-'));
    await chmod(dir, 0o700);
    const file = join(dir, 'auth.json');
    const auth = Buffer.from(`${credentials.username}:${credentials.password}`).toString('base64');
    // Keyed by registry: it covers the registry's mirrors' look-ups of the same repository too.
    await writeFile(file, JSON.stringify({ auths: { [ref.registry]: { auth } } }), { mode: 0o600 });
    return { registriesConf, args: ['--authfile', file], cleanup: () => rm(dir, { recursive: true, force: true }) };
  }

  /** skopeo's registries.conf for this registry: its mirrors, and which endpoints may be plain HTTP. */
  private async registriesConf(ref: ImageReference): Promise<string> {
    const file = join(this.options.storeDir, `registries-${createHash('sha256').update(ref.registry).digest('hex').slice(0, 16)}.conf`);
    await writeFileAtomic(file, renderRegistriesConf(ref.registry, this.options));
    return file;
  }

  private skopeo(args: string[], registriesConf: string, timeoutMs: number, signal?: AbortSignal): Promise<Buffer> {
    // Our registries.conf and policy instead of /etc/containers/'s: the host's files play no part.
    // (skopeo 1.9 takes --registries-conf as a global option; it ignores CONTAINERS_REGISTRIES_CONF.)
    const global = ['--registries-conf', registriesConf, '--policy', join(this.options.storeDir, 'policy.json')];
    return runTool(this.options.skopeoBinary ?? 'skopeo', args, { timeoutMs, signal, globalArgs: global });
  }
}

// ---- helpers ------------------------------------------------------------------------------------

export function hexOf(id: string): string {
  return id.slice('sha256:'.length);
}

function parseJson(raw: Buffer, what: string): unknown {
  try {
    return JSON.parse(raw.toString('utf8'));
  } catch {
    throw new ImageError('internal', `${what}: the registry sent a manifest that is not JSON`);
  }
}

function parseManifest(raw: Buffer, what: string): z.infer<typeof ImageManifest> {
  const manifest = ImageManifest.safeParse(parseJson(raw, what));
  if (!manifest.success) throw new ImageError('validation_failed', `${what}: not an image manifest Nestbox can use (schema 2 / OCI with config and layers)`);
  return manifest.data;
}

function imageConfigOf(config: z.infer<typeof ImageConfig>): OciImageConfig {
  const c = config.config ?? {};
  return {
    env: c.Env ?? [],
    cmd: c.Cmd ?? null,
    entrypoint: c.Entrypoint ?? null,
    workingDir: c.WorkingDir ?? '',
    user: c.User ?? '',
    exposedPorts: Object.keys(c.ExposedPorts ?? {}),
    labels: c.Labels ?? {},
  };
}

/**
 * Mount points the local driver needs, made in the image so sandbox upper layers stay clean (as
 * base-image.ts does), the working directory, which Docker creates when an image lacks it, and
 * a /tmp (mode 1777) when the image has none.
 */
async function prepareTreeForSandboxes(rootfs: string, workingDir: string): Promise<void> {
  // Never through a symlink of the image: this runs as host root, where an image's absolute
  // link points into the host. A path with one is left alone (the launcher refuses the mount
  // points that matter, and a missing working directory only changes the default cwd).
  const makeDirs = async (path: string): Promise<void> => {
    let current = rootfs;
    for (const part of path.split('/').filter((p) => p && p !== '.')) {
      if (part === '..') return;
      current = join(current, part);
      const info = await lstat(current).catch(() => undefined);
      if (!info) await mkdir(current, { mode: 0o755 });
      else if (!info.isDirectory()) return;
    }
  };
  for (const dir of ['.nestbox', 'proc', 'sys', 'dev']) await makeDirs(dir);
  if (workingDir.startsWith('/')) await makeDirs(workingDir);
  // The agent's sessions and uploads need a /tmp, which minimal images (busybox, scratch) lack.
  if (!(await lstat(join(rootfs, 'tmp')).catch(() => undefined))) {
    await mkdir(join(rootfs, 'tmp'));
    await chmod(join(rootfs, 'tmp'), 0o1777);
  }
}

/**
 * Device nodes are removed from the tree: a sandbox opening a block or character device an image
 * brought (a host disk's major:minor, mode 0666) would reach the host's device, since the
 * sandbox has no devices cgroup and its root overlay is not nodev. Sandboxes get their devices
 * from the launcher's own /dev. umoci has already applied whiteouts, so none is one. `find -P`
 * never follows the image's symlinks, and -xdev keeps it on the store's file system.
 */
async function removeDeviceNodes(rootfs: string, timeoutMs: number): Promise<string[]> {
  const { stdout } = await execFileAsync('find', ['-P', rootfs, '-xdev', '(', '-type', 'b', '-o', '-type', 'c', ')', '-print0', '-delete'], { timeout: timeoutMs, maxBuffer: 64 * 1024 * 1024 });
  return stdout.split('\0').filter(Boolean).map((path) => path.slice(rootfs.length) || '/');
}

async function diskUsageBytes(path: string): Promise<number> {
  try {
    const { stdout } = await execFileAsync('du', ['-sb', '--one-file-system', path]);
    return Number(stdout.split('\t')[0]) || 0;
  } catch {
    return 0;
  }
}

interface SkopeoAuth {
  registriesConf: string;
  /** `--no-creds` or `--authfile <file>` (an inspect's spelling; a copy's takes `--src-`). */
  args: string[];
  cleanup: () => Promise<void>;
}

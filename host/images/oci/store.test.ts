// The OCI image store against Debian's registry on loopback, seeded with images built here:
// pull and unpack (whiteouts applied, config recorded), one copy per digest (twice, by digest,
// concurrently), manifest lists resolved to linux/amd64, a missing tag, basic auth, a mirror,
// and what a killed pull leaves behind.
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { execFileSync, spawn } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ImageError } from './errors.js';
import { parseImageReference } from './reference.js';
import { OciImageStore } from './store.js';
import { buildTestImage, busyboxImageSpec, distrolessImageSpec, pushTestImage, startTestRegistry, type TestRegistry } from './test-registry.js';

const CREDS = { username: 'tester', password: 'correct horse' };
// The killed puller is a separate node process running the built store (npm run build).
const DIST_STORE = resolve(import.meta.dirname, '../../../dist/host/images/oci/store.js');

describe('OCI image store', () => {
  let dir: string;
  let registry: TestRegistry;
  let authRegistry: TestRegistry;
  let busyboxLayout: string;
  const storeDir = () => join(dir, 'store');

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'nestbox-oci-'));
    [registry, authRegistry] = await Promise.all([startTestRegistry(), startTestRegistry({ htpasswd: CREDS })]);
    busyboxLayout = await buildTestImage(join(dir, 'busybox'), busyboxImageSpec({ files: { 'etc/removed': { content: 'gone\n' } }, whiteouts: ['/etc/removed'], env: ['GREETING=hello from the image', 'PATH=/bin'], workingDir: '/work', labels: { 'org.example.test': 'yes' } }));
    await pushTestImage(busyboxLayout, `${registry.host}/test/busybox:1`);
    await pushTestImage(busyboxLayout, `${registry.host}/test/busybox:other-tag`);
    await pushTestImage(busyboxLayout, `${authRegistry.host}/private/busybox:1`, CREDS);
  }, 300_000);

  afterAll(async () => {
    await Promise.all([registry?.stop(), authRegistry?.stop()]);
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('pulls and unpacks an image, applying whiteouts and recording its config', async () => {
    const store = new OciImageStore({ storeDir: storeDir() });
    const image = await store.pull(`${registry.host}/test/busybox:1`);
    expect(image.pulled).toBe(true);
    expect(image.meta.id).toMatch(/^sha256:[a-f0-9]{64}$/);
    expect(image.meta.reference).toBe(`${registry.host}/test/busybox:1`);
    expect(lstatSync(join(image.rootfs, 'bin', 'busybox')).isFile()).toBe(true);
    expect(lstatSync(join(image.rootfs, 'bin', 'sh')).isSymbolicLink()).toBe(true);
    expect(existsSync(join(image.rootfs, 'etc', 'removed'))).toBe(false);
    expect(lstatSync(join(image.rootfs, 'work')).isDirectory()).toBe(true);
    expect(image.meta.config.env).toEqual(expect.arrayContaining(['GREETING=hello from the image', 'PATH=/bin']));
    expect(image.meta.config.workingDir).toBe('/work');
    expect(image.meta.config.labels['org.example.test']).toBe('yes');
    expect(image.meta.layers).toHaveLength(2);
    expect(image.meta.sizeBytes).toBeGreaterThan(1_000_000);
    // The id is the registry's manifest digest.
    const raw = execFileSync('skopeo', ['inspect', '--raw', '--tls-verify=false', `docker://${registry.host}/test/busybox:1`]);
    expect(image.meta.id).toBe(`sha256:${createHash('sha256').update(raw).digest('hex')}`);
    expect(JSON.parse(readFileSync(join(image.rootfs, '..', 'image.json'), 'utf8')).id).toBe(image.meta.id);
    expect(await store.get(image.meta.id)).toMatchObject({ rootfs: image.rootfs });
  });

  it('keeps one copy per digest: pulled again, by another tag, by digest', async () => {
    const store = new OciImageStore({ storeDir: storeDir() });
    const first = await store.pull(`${registry.host}/test/busybox:1`);
    const again = await store.pull(`${registry.host}/test/busybox:other-tag`);
    const byDigest = await store.pull(`${registry.host}/test/busybox@${first.meta.id}`);
    expect(again.pulled).toBe(false);
    expect(byDigest.pulled).toBe(false);
    expect(new Set([first.meta.id, again.meta.id, byDigest.meta.id]).size).toBe(1);
    expect(readdirSync(join(storeDir(), 'images'))).toEqual([first.meta.id.slice(7)]);
  });

  it('keeps pulled layers in a layer cache: an image sharing layers with one already here fetches only the rest', async () => {
    // Two images with the same layers and different configs (umoci config makes a new manifest).
    const layout = await buildTestImage(join(dir, 'shared'), busyboxImageSpec({ files: { 'etc/shared': { content: 'shared\n' } }, whiteouts: ['/etc/shared'] }));
    await pushTestImage(layout, `${registry.host}/test/shared:a`);
    execFileSync('umoci', ['config', '--image', layout, '--config.env', 'VARIANT=b']);
    await pushTestImage(layout, `${registry.host}/test/shared:b`);
    const store = new OciImageStore({ storeDir: join(dir, 'cache-store') });
    const lines: string[] = [];
    const a = await store.pull(`${registry.host}/test/shared:a`, { onProgress: (l) => lines.push(l) });
    expect(lines.join('\n')).toContain('0 of 2 layers from the layer cache');
    lines.length = 0;
    const b = await store.pull(`${registry.host}/test/shared:b`, { onProgress: (l) => lines.push(l) });
    expect(b.meta.id).not.toBe(a.meta.id);
    expect(b.meta.layers.map((l) => l.digest)).toEqual(a.meta.layers.map((l) => l.digest));
    expect(lines.join('\n')).toContain('2 of 2 layers from the layer cache');
    expect(readFileSync(join(b.rootfs, 'bin/busybox')).length).toBeGreaterThan(0);
    const blobs = () => readdirSync(join(dir, 'cache-store', 'blobs', 'sha256')).sort();
    expect(blobs()).toEqual(a.meta.layers.map((l) => l.digest.slice(7)).sort());
    // Layers stay while one image lists them, and go with the last.
    await store.remove(a.meta.id);
    expect(blobs()).toHaveLength(2);
    await store.remove(b.meta.id);
    expect(blobs()).toEqual([]);
  });

  it('makes one copy when two pulls of one image race', async () => {
    const layout = await buildTestImage(join(dir, 'race'), distrolessImageSpec());
    await pushTestImage(layout, `${registry.host}/test/distroless:race`);
    const store = new OciImageStore({ storeDir: join(dir, 'race-store') });
    const [a, b] = await Promise.all([store.pull(`${registry.host}/test/distroless:race`), new OciImageStore({ storeDir: join(dir, 'race-store') }).pull(`${registry.host}/test/distroless:race`)]);
    expect(a.meta.id).toBe(b.meta.id);
    expect([a.pulled, b.pulled].filter(Boolean)).toHaveLength(1);
    expect(readdirSync(join(dir, 'race-store', 'images'))).toHaveLength(1);
    expect(readdirSync(join(dir, 'race-store', 'tmp'))).toEqual([]);
    expect(existsSync(join(a.rootfs, 'tini'))).toBe(true);
    expect(existsSync(join(a.rootfs, 'bin'))).toBe(false);
  });

  it('answers not_found for a tag or repository that does not exist', async () => {
    const store = new OciImageStore({ storeDir: storeDir() });
    const missingTag = await store.pull(`${registry.host}/test/busybox:no-such-tag`).catch((error) => error);
    expect(missingTag).toBeInstanceOf(ImageError);
    expect(missingTag.code).toBe('not_found');
    expect(missingTag.message).toContain('manifest unknown');
    const missingRepo = await store.pull(`${registry.host}/test/nothing-here:1`).catch((error) => error);
    expect(missingRepo.code).toBe('not_found');
    const unreachable = await store.pull('127.0.0.1:1/test/busybox:1').catch((error) => error);
    expect(unreachable.code).toBe('host_unavailable');
  });

  it('refuses bad references with validation_failed', async () => {
    const store = new OciImageStore({ storeDir: storeDir() });
    for (const bad of ['', 'UPPER/case', 'x@sha256:abc', 'a/b:bad tag']) {
      const error = await store.pull(bad).catch((e) => e);
      expect(error.code, bad).toBe('validation_failed');
    }
    expect(parseImageReference('busybox')).toEqual({ registry: 'docker.io', repository: 'library/busybox', tag: 'latest' });
    expect(parseImageReference('localhost:5000/a/b@sha256:' + 'a'.repeat(64))).toMatchObject({ registry: 'localhost:5000', repository: 'a/b', tag: undefined });
  });

  it('pulls from a basic-auth registry with the right credentials only, never leaving them in argv or on disk', async () => {
    const store = new OciImageStore({ storeDir: join(dir, 'auth-store') });
    const ref = `${authRegistry.host}/private/busybox:1`;
    const anonymous = await store.pull(ref).catch((error) => error);
    expect(anonymous.code).toBe('unauthorized');
    const wrong = await store.pull(ref, { credentials: { username: CREDS.username, password: 'wrong' } }).catch((error) => error);
    expect(wrong.code).toBe('unauthorized');
    const seenArgv: string[] = [];
    const watcher = setInterval(() => {
      for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
        try {
          const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
          if (cmdline.startsWith('skopeo')) seenArgv.push(cmdline);
        } catch {
          // Gone.
        }
      }
    }, 5);
    try {
      const image = await store.pull(ref, { credentials: CREDS });
      expect(image.pulled).toBe(true);
    } finally {
      clearInterval(watcher);
    }
    expect(seenArgv.join('\n')).not.toContain(CREDS.password);
    expect(readdirSync(tmpdir()).filter((entry) => entry.startsWith('nestbox-auth-'))).toEqual([]);
  });

  it('resolves a manifest list to its linux/amd64 image', async () => {
    const layout = join(dir, 'busybox', 'layout');
    // An image index with an arm64 entry first (the same manifest: only the platform differs).
    const index = JSON.parse(readFileSync(join(layout, 'index.json'), 'utf8'));
    const image = index.manifests.find((m: { annotations?: Record<string, string> }) => m.annotations?.['org.opencontainers.image.ref.name'] === 'image');
    const entry = (architecture: string) => ({ mediaType: image.mediaType, digest: image.digest, size: image.size, platform: { os: 'linux', architecture } });
    const list = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json', manifests: [entry('arm64'), entry('amd64')] }));
    const listDigest = createHash('sha256').update(list).digest('hex');
    mkdirSync(join(layout, 'blobs', 'sha256'), { recursive: true });
    writeFileSync(join(layout, 'blobs', 'sha256', listDigest), list);
    index.manifests.push({ mediaType: 'application/vnd.oci.image.index.v1+json', digest: `sha256:${listDigest}`, size: list.length, annotations: { 'org.opencontainers.image.ref.name': 'multi' } });
    writeFileSync(join(layout, 'index.json'), JSON.stringify(index));
    execFileSync('skopeo', ['copy', '--quiet', '--all', '--dest-tls-verify=false', `oci:${layout}:multi`, `docker://${registry.host}/test/busybox:multi`], { timeout: 120_000 });
    const store = new OciImageStore({ storeDir: join(dir, 'list-store') });
    const pulled = await store.pull(`${registry.host}/test/busybox:multi`);
    expect(pulled.pulled).toBe(true);
    expect(pulled.meta.id).toBe(image.digest);
    expect(pulled.meta.source.indexDigest).toBe(`sha256:${listDigest}`);
    // The store that pulled busybox:1 before already has that digest: nothing is copied.
    const again = await new OciImageStore({ storeDir: storeDir() }).pull(`${registry.host}/test/busybox:multi`);
    expect(again).toMatchObject({ pulled: false, meta: { id: image.digest } });
  });

  it('removes the device nodes an image brings (a sandbox could open the host device through them)', async () => {
    const work = join(dir, 'devices');
    const layout = join(work, 'layout');
    execFileSync('umoci', ['init', '--layout', layout]);
    execFileSync('umoci', ['new', '--image', `${layout}:image`]);
    const tree = join(work, 'tree');
    mkdirSync(join(tree, 'bin'), { recursive: true });
    writeFileSync(join(tree, 'bin', 'keep'), 'a file\n');
    // /dev/null's and a disk's numbers: harmless here (the tree is only packed), fatal in a sandbox.
    execFileSync('mknod', ['-m', '666', join(tree, 'null-like'), 'c', '1', '3']);
    execFileSync('mknod', ['-m', '666', join(tree, 'bin', 'disk-like'), 'b', '8', '0']);
    execFileSync('umoci', ['insert', '--image', `${layout}:image`, tree, '/'], { timeout: 120_000 });
    await pushTestImage(`${layout}:image`, `${registry.host}/test/devices:1`);
    const image = await new OciImageStore({ storeDir: join(dir, 'devices-store') }).pull(`${registry.host}/test/devices:1`);
    expect(image.meta.removedDeviceNodes.sort()).toEqual(['/bin/disk-like', '/null-like']);
    expect(existsSync(join(image.rootfs, 'null-like'))).toBe(false);
    expect(existsSync(join(image.rootfs, 'bin', 'disk-like'))).toBe(false);
    expect(readFileSync(join(image.rootfs, 'bin', 'keep'), 'utf8')).toBe('a file\n');
    const found = execFileSync('find', [image.rootfs, '(', '-type', 'b', '-o', '-type', 'c', ')'], { encoding: 'utf8' });
    expect(found).toBe('');
  });

  it('pulls an image in Docker\'s manifest format (schema 2), keeping the registry\'s digest as its id', async () => {
    await pushTestImage(busyboxLayout, `${registry.host}/test/docker-format:1`, undefined, { format: 'v2s2' });
    const raw = execFileSync('skopeo', ['inspect', '--raw', '--tls-verify=false', `docker://${registry.host}/test/docker-format:1`]);
    expect(JSON.parse(raw.toString()).mediaType).toBe('application/vnd.docker.distribution.manifest.v2+json');
    const image = await new OciImageStore({ storeDir: join(dir, 'docker-format-store') }).pull(`${registry.host}/test/docker-format:1`);
    expect(image.meta.id).toBe(`sha256:${createHash('sha256').update(raw).digest('hex')}`);
    expect(image.meta.layers[0].mediaType).toBe('application/vnd.docker.image.rootfs.diff.tar.gzip');
    expect(image.meta.config.env).toContain('GREETING=hello from the image');
    expect(lstatSync(join(image.rootfs, 'bin', 'busybox')).isFile()).toBe(true);
    expect(existsSync(join(image.rootfs, 'etc', 'removed'))).toBe(false);
  });

  it('pulls an image whose layers are zstd-compressed', async () => {
    // Layers of their own: skopeo would reuse the gzip blobs the registry has of identical ones.
    const layout = await buildTestImage(join(dir, 'zstd'), busyboxImageSpec({ files: { 'etc/unique': { content: randomBytes(16).toString('hex') }, 'etc/removed-too': { content: 'gone\n' } }, whiteouts: ['/etc/removed-too'] }));
    await pushTestImage(layout, `${registry.host}/test/busybox:zstd`, undefined, { compression: 'zstd' });
    const store = new OciImageStore({ storeDir: join(dir, 'zstd-store') });
    const image = await store.pull(`${registry.host}/test/busybox:zstd`);
    expect(image.meta.layers.map((layer) => layer.mediaType)).toEqual(['application/vnd.oci.image.layer.v1.tar+zstd', 'application/vnd.oci.image.layer.v1.tar+zstd']);
    expect(lstatSync(join(image.rootfs, 'bin', 'busybox')).isFile()).toBe(true);
    expect(existsSync(join(image.rootfs, 'etc', 'removed-too'))).toBe(false);
    expect(existsSync(join(image.rootfs, 'etc', 'unique'))).toBe(true);
  });

  it('pulls through a configured mirror', async () => {
    // 127.0.0.2:9 answers nothing: the image can only come from the mirror.
    const store = new OciImageStore({ storeDir: join(dir, 'mirror-store'), mirrors: { '127.0.0.2:9': [registry.host] } });
    const image = await store.pull('127.0.0.2:9/test/busybox:1');
    expect(image.pulled).toBe(true);
    expect(image.meta.source.registry).toBe('127.0.0.2:9');
  });

  it('shows nothing of a pull killed with -9, takes its skopeo and umoci with it, and pulls again', async () => {
    // A layer big enough that the copy and unpack take a moment (random bytes do not compress).
    const blob = join(dir, 'big.bin');
    writeFileSync(blob, randomBytes(48 * 1024 * 1024));
    const layout = await buildTestImage(join(dir, 'big'), busyboxImageSpec({ files: { 'big.bin': { copyFrom: blob } } }));
    await pushTestImage(layout, `${registry.host}/test/big:1`);
    const killedStore = join(dir, 'killed-store');
    const script = `import(${JSON.stringify(DIST_STORE)}).then((m) => new m.OciImageStore({ storeDir: ${JSON.stringify(killedStore)} }).pull(${JSON.stringify(`${registry.host}/test/big:1`)}))`;
    const child = spawn(process.execPath, ['-e', script], { stdio: 'ignore' });
    // Its skopeo copy (a process naming the temp dir) is what we wait for; then kill -9.
    const workers = () => readdirSync('/proc').filter((pid) => /^\d+$/.test(pid) && (() => { try { const cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8'); return cmdline.includes(join(killedStore, 'tmp')) && !cmdline.startsWith('setpriv'); } catch { return false; } })());
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline && workers().length === 0) await new Promise((r) => setTimeout(r, 2));
    const running = workers();
    expect(running.length).toBeGreaterThan(0);
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    // Its skopeo dies with it (parent-death signal) instead of finishing the copy as an orphan.
    for (let i = 0; i < 20 && running.some((pid) => existsSync(`/proc/${pid}/cmdline`) && readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(killedStore)); i++) await new Promise((r) => setTimeout(r, 10));
    expect(running.filter((pid) => existsSync(`/proc/${pid}/cmdline`) && readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(killedStore))).toEqual([]);
    expect(readdirSync(join(killedStore, 'images'))).toEqual([]);
    const image = await new OciImageStore({ storeDir: killedStore }).pull(`${registry.host}/test/big:1`);
    expect(image.pulled).toBe(true);
    expect(readFileSync(join(image.rootfs, 'big.bin')).equals(readFileSync(blob))).toBe(true);
    expect(readdirSync(join(killedStore, 'tmp'))).toEqual([]);
    expect(readdirSync(join(killedStore, 'locks'))).toEqual([]);
  });

  it('sweeps what a killed pull left (temp dir, stale lock) and pulls again', async () => {
    const store = new OciImageStore({ storeDir: join(dir, 'crash-store') });
    await store.open();
    const probe = await new OciImageStore({ storeDir: join(dir, 'probe-store') }).pull(`${registry.host}/test/busybox:1`);
    const hex = probe.meta.id.slice(7);
    // What a kill -9 in the middle of a pull leaves: its temp dir and its lock (pid 999999999 does not exist).
    mkdirSync(join(dir, 'crash-store', 'tmp', `${hex}-999999999-dead`, 'rootfs'), { recursive: true });
    writeFileSync(join(dir, 'crash-store', 'locks', `${hex}.lock`), JSON.stringify({ pid: 999_999_999, startTime: '1' }));
    expect(await store.get(probe.meta.id)).toBeUndefined();
    const image = await store.pull(`${registry.host}/test/busybox:1`);
    expect(image.pulled).toBe(true);
    expect(readdirSync(join(dir, 'crash-store', 'tmp'))).toEqual([]);
    expect(readdirSync(join(dir, 'crash-store', 'locks'))).toEqual([]);
    await store.remove(image.meta.id);
    expect(await store.get(image.meta.id)).toBeUndefined();
    expect(readdirSync(join(dir, 'crash-store', 'images'))).toEqual([]);
  });
});

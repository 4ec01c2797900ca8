// The language servers of the default image (Daytona's `sandbox.createLspServer`, run by the
// guest agent's host/guest-agent/lsp.ts):
// - python: Debian's python3-pylsp (python-lsp-server on jedi), installed by debootstrap with
//   the image's other packages (LANGUAGE_SERVER_PACKAGES goes into the --include list);
// - typescript and javascript: typescript-language-server and typescript from the npm registry,
//   installed into <rootfs>/opt/nestbox/lsp after debootstrap by the host's npm (Debian has no
//   package of either), pinned here.
// Node inside the sandbox: the host's node is bind-mounted at /.nestbox/bin/node in every
// sandbox (local driver: read-only, mode 0755, so workloads may run it too; VM image: a copy at
// the same path). It is not on PATH, so the guest agent starts the server's cli.mjs with that
// absolute interpreter, and the server starts tsserver with its own process.execPath.
import { mkdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { runWithProgress } from './run-with-progress.js';
import { LANGUAGE_SERVERS_PREFIX } from '../agent-protocol/lsp.js';

/**
 * Debian packages for the language servers (added to the image's debootstrap --include).
 * setuptools: pylsp loads its plugins (jedi completion, symbols…) through pkg_resources entry
 * points, which check pylsp's declared requirement on setuptools; without it every plugin is
 * skipped and pylsp answers nothing (debootstrap installs no Recommends).
 */
export const LANGUAGE_SERVER_PACKAGES = ['python3-pylsp', 'python3-setuptools'] as const;

/** 4.x runs on Node ≥ 18 (5.x and later need 20 or 22); the host's node runs it. */
export const TYPESCRIPT_LANGUAGE_SERVER_VERSION = '4.4.1';
export const TYPESCRIPT_VERSION = '5.9.3';

/** The npm packages installed into the image, pinned. */
export const LANGUAGE_SERVER_NPM_PACKAGES = [`typescript-language-server@${TYPESCRIPT_LANGUAGE_SERVER_VERSION}`, `typescript@${TYPESCRIPT_VERSION}`] as const;

/**
 * What installLanguageServers puts into the image: it changes whenever its result would, so an
 * image cache keyed on it (with the package list) is rebuilt then.
 */
export const LANGUAGE_SERVERS_IMAGE_KEY = `npm:${LANGUAGE_SERVER_NPM_PACKAGES.join(',')}@${LANGUAGE_SERVERS_PREFIX}`;

const NPM_INSTALL_TIMEOUT_MS = 10 * 60_000;

/**
 * Installs typescript-language-server and typescript into `<rootfs>/opt/nestbox/lsp` with the
 * host's npm (no install scripts run: neither package has one, and none may run on the host).
 */
export async function installLanguageServers(rootfs: string, progress: (line: string) => void = () => {}, npm = 'npm'): Promise<void> {
  const prefix = join(rootfs, LANGUAGE_SERVERS_PREFIX);
  await mkdir(prefix, { recursive: true, mode: 0o755 });
  progress(`installing ${LANGUAGE_SERVER_NPM_PACKAGES.join(' ')} into ${LANGUAGE_SERVERS_PREFIX}`);
  const args = ['install', '--prefix', prefix, '--omit=dev', '--ignore-scripts', '--no-audit', '--no-fund', '--no-update-notifier', ...LANGUAGE_SERVER_NPM_PACKAGES];
  // umask 022: the tree must be readable by every sandbox user, whatever the host's umask.
  await runWithProgress('/bin/sh', ['-c', 'umask 022 && exec "$0" "$@"', npm, ...args], progress, {
    what: `npm install ${LANGUAGE_SERVER_NPM_PACKAGES.join(' ')}`,
    timeoutMs: NPM_INSTALL_TIMEOUT_MS,
  });
  // Checked, so an image never ships without what the guest agent will run.
  const cli = join(prefix, 'node_modules', 'typescript-language-server', 'lib', 'cli.mjs');
  if (!(await stat(cli).catch(() => undefined))?.isFile()) throw new Error(`npm finished but ${cli} is missing`);
}

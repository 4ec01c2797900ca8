import { existsSync } from 'node:fs';
import { defineConfig } from 'vitest/config';

// Two tiers, one run. `npm test` (`vitest run`) runs both; `npm run test:unit` runs only the
// first, which needs no root, no PostgreSQL server, no build (dist/) and no sandbox or base
// image: only the sources and node_modules (PGlite, an in-process HTTP server or a temp dir are
// fine). A file belongs to `unit` only if every test in it passes, none skipped, as an ordinary
// user; everything else, including every new test file until someone moves it here, is
// `integration` (real server, real PostgreSQL, real local driver, as root).
const UNIT = [
  'core/errors.test.ts',
  'core/transfer-token.test.ts',
  'core/services/host-transfer.test.ts',
  'host/storage/transfer.test.ts',
  'core/state-machine.test.ts',
  'core/services/auth.test.ts',
  'core/services/rate-limits.test.ts',
  'core/images/dockerfile.test.ts',
  'core/images/expand.test.ts',
  'core/images/steps-json.test.ts',
  'core/images/copy-archive.test.ts',
  'src/config.test.ts',
  'src/object-store/fs-object-store.test.ts',
  'src/http/native/spec.test.ts',
  'src/http/native/spec-docs.test.ts',
  'src/http/port-proxy.test.ts',
  'src/http/stream-limits.test.ts',
  'src/ssh/host-key.test.ts',
  'contract-tests/daytona/translations.test.ts',
  'contract-tests/daytona/object-storage-proxy.test.ts',
  'host/agent/server.test.ts',
  'host/drivers/cloud-hypervisor/unit.test.ts',
  'host/drivers/local/id-ranges.test.ts',
  // A directory shaped like a v2 cgroupfs (this machine is v1): Nestbox's side of v2 cpusets.
  'host/drivers/local/cgroups-v2-cpuset.test.ts',
  'host/network/network.test.ts',
  'host/guest-agent/paths.test.ts',
  'host/guest-agent/processes/output-buffer.test.ts',
  // An in-process guest agent on a Unix socket in a temp dir, running commands as the caller
  // (the PTY tests compile nestbox-pty.c with cc first).
  'host/guest-agent/server.test.ts',
  'host/guest-agent/files.test.ts',
  'host/guest-agent/files-large.test.ts',
  'host/guest-agent/files-multipart.test.ts',
  'host/guest-agent/files-search.test.ts',
  'host/guest-agent/files-watch.test.ts',
  'host/guest-agent/processes/pty.test.ts',
  'host/guest-agent/processes/sessions.test.ts',
  'host/images/base-image.test.ts',
  'host/images/vm-image.test.ts',
  'host/images/oci/tools.test.ts',
];

// A listed file that moved would quietly fall back to `integration` (it still runs in `npm test`):
// say so, so that the list follows the file.
for (const file of UNIT.filter((path) => !existsSync(new URL(path, import.meta.url)))) {
  process.stderr.write(`vitest.config.ts: the unit test ${file} does not exist (moved? update UNIT)\n`);
}

const ALL = ['core/**/*.test.ts', 'http-kit/**/*.test.ts', 'host/**/*.test.ts', 'src/**/*.test.ts', 'test/**/*.test.ts', 'contract-tests/**/*.test.ts'];
const NEVER = ['node_modules/**', 'dist/**'];

// Integration files share the machine: its network namespaces, cgroups, loop devices, /proc and
// one PostgreSQL server (each file on a database of its own, each server on a data dir of its
// own). Most only look at what they made, so they run two at a time, which is what a 2-core CI
// machine affords: they spend much of their time waiting on sandboxes, kernels and SDK round trips.
// The files below look at the whole machine instead (a diff of every network namespace, every
// process of a uid, every loop device, argv of every skopeo, fixed namespace names or ports), so
// another file's sandboxes would read as their leak: they run afterwards, one at a time.
const MACHINE_WIDE = [
  'host/agent/images.test.ts',
  'host/drivers/local/*.test.ts',
  'host/guest-agent/processes/processes.test.ts',
  'host/images/chroot.test.ts',
  'host/images/oci/store.test.ts',
  'host/network/egress-enforcement.test.ts',
  'host/network/source-check.test.ts',
  'test/crash-recovery.test.ts',
  'test/fuzz.test.ts',
  'test/large-transfer.test.ts',
  'test/lifecycle.test.ts',
  'test/networking.test.ts',
];

export default defineConfig({
  test: {
    pool: 'forks',
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 600_000,
    projects: [
      {
        extends: true,
        // Unit files run first, so a broken pure function is reported before the slow tier starts.
        test: { name: 'unit', include: UNIT, exclude: NEVER, sequence: { groupOrder: 0 } },
      },
      {
        extends: true,
        test: {
          name: 'integration',
          include: ALL,
          exclude: [...NEVER, ...UNIT, ...MACHINE_WIDE],
          maxWorkers: 2,
          sequence: { groupOrder: 1 },
          // Builds (or reuses) the base image every integration test shares.
          globalSetup: ['test/global-setup.ts'],
        },
      },
      {
        extends: true,
        test: {
          name: 'machine-wide',
          include: MACHINE_WIDE,
          exclude: NEVER,
          maxWorkers: 1,
          sequence: { groupOrder: 2 },
          globalSetup: ['test/global-setup.ts'],
        },
      },
    ],
  },
});

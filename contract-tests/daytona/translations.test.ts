// Unit tests of the Daytona translators' pure parts (no server): interval → policy mapping,
// git status parsing and failure classification, signed-URL signing and lifetime, the DTO's states.
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { NestboxError } from '../../core/errors.js';
import type { Sandbox } from '../../core/types.js';
import { createInput, intervalsToPolicy } from '../../compat/daytona/control-plane.js';
import { classifyGitFailure, parsePorcelainStatus } from '../../compat/daytona/git.js';
import { checkExpiry, fileUrlSignature } from '../../compat/daytona/signing.js';
import { renderDaytonaSandbox } from '../../compat/daytona/sandbox-dto.js';
import { daytonaFileInfo } from '../../compat/daytona/toolbox.js';
import { parseToolboxPath } from '../../compat/daytona/websockets.js';

describe('Daytona translations', () => {
  it('maps intervals onto the idle policy, auto-delete and TTL', () => {
    expect(intervalsToPolicy({ autoStopInterval: 15 }, 86400)).toEqual({ idleTimeoutSeconds: 900, idleAction: 'stop' });
    expect(intervalsToPolicy({ autoStopInterval: 15, autoPauseInterval: 5 }, 86400)).toEqual({ idleTimeoutSeconds: 300, idleAction: 'pause' });
    expect(intervalsToPolicy({ autoDeleteInterval: -1 }, 86400)).toEqual({ autoDeleteSeconds: null });
    expect(intervalsToPolicy({ autoDeleteInterval: 0 }, 86400)).toEqual({ autoDeleteSeconds: 0 });
    expect(intervalsToPolicy({ ttlMinutes: 10 }, 86400)).toEqual({ timeoutSeconds: 600, autoDeleteSeconds: 0 });
    expect(() => intervalsToPolicy({ autoStopInterval: 100_000 }, 86400)).toThrow(/autoStopInterval: must be at most 1440 minutes/);
  });

  it('translates the create body: GiB to MiB, no absolute timeout, refuses what would be faked', () => {
    expect(createInput({ memory: 2, cpu: 2, env: { A: '1' }, labels: {} }, 86400)).toMatchObject({ memoryMiB: 2048, cpu: 2, timeoutSeconds: 0, idleTimeoutSeconds: 900, idleAction: 'stop' });
    expect(createInput({ ttlMinutes: 5 }, 86400)).toMatchObject({ timeoutSeconds: 300, autoDeleteSeconds: 0 });
    // Network options map onto core's egress policy (enforced by the host's nftables).
    expect(createInput({ networkBlockAll: true }, 86400).egress).toEqual({ mode: 'deny-all' });
    expect(createInput({ networkAllowList: '203.0.113.0/24, 198.51.100.7/32', domainAllowList: 'example.com' }, 86400).egress).toEqual({ mode: 'allow-list', allow: ['203.0.113.0/24', '198.51.100.7/32', 'example.com'] });
    expect(createInput({}, 86400).egress).toBeUndefined();
    // An image (buildInfo) is built on demand (images.ts), but not next to a snapshot.
    expect(() => createInput({ buildInfo: { dockerfileContent: 'FROM default' }, snapshot: 's' }, 86400)).toThrow(/either a snapshot or an image/);
    // Organisation secrets: one {ENV: "secretName"} object each, as core's references.
    expect(createInput({ secrets: [{ A: 's' }, { B: 't' }] }, 86400).secrets).toEqual([{ env: 'A', name: 's' }, { env: 'B', name: 't' }]);
    expect(() => createInput({ secrets: [{ A: 's', B: 't' }] }, 86400)).toThrow(/secrets\[0\]/);
    // Volumes (volumes.ts): by id or name, read-write, the subpath kept.
    expect(createInput({ volumes: [{ volumeId: 'v', mountPath: '/d', subpath: 'x/y' }] }, 86400).volumes).toEqual([{ volumeId: 'v', mountPath: '/d', readOnly: false, subpath: 'x/y' }]);
    for (const body of [{ gpu: 1 }]) {
      const err = (() => {
        try {
          createInput(body, 86400);
        } catch (e) {
          return e;
        }
      })();
      expect(err).toBeInstanceOf(NestboxError);
      expect((err as NestboxError).code).toBe('not_supported');
    }
  });

  it('parses git porcelain status', () => {
    expect(parsePorcelainStatus('## main...origin/main [ahead 2, behind 1]\n M a.txt\nA  b.txt\n?? c.txt\nR  old.txt -> new.txt\n')).toEqual({
      currentBranch: 'main',
      upstream: 'origin/main',
      branchPublished: true,
      ahead: 2,
      behind: 1,
      detached: false,
      fileStatus: [
        { name: 'a.txt', staging: 'Unmodified', worktree: 'Modified', extra: '' },
        { name: 'b.txt', staging: 'Added', worktree: 'Unmodified', extra: '' },
        { name: 'c.txt', staging: 'Untracked', worktree: 'Untracked', extra: '' },
        { name: 'new.txt', staging: 'Renamed', worktree: 'Unmodified', extra: 'old.txt' },
      ],
    });
    expect(parsePorcelainStatus('## No commits yet on trunk\n')).toMatchObject({ currentBranch: 'trunk', branchPublished: false });
    expect(parsePorcelainStatus('## HEAD (no branch)\n')).toMatchObject({ detached: true });
  });

  it('classifies git failures into the daemon codes the SDK maps to classes', () => {
    expect(classifyGitFailure('fatal: not a git repository (or any of the parent directories): .git')).toEqual({ code: 'not_found', daytona: 'GIT_REPO_NOT_FOUND' });
    expect(classifyGitFailure("error: pathspec 'nope' did not match any file(s) known to git")).toEqual({ code: 'not_found', daytona: 'GIT_BRANCH_NOT_FOUND' });
    expect(classifyGitFailure("fatal: a branch named 'x' already exists")).toEqual({ code: 'conflict', daytona: 'GIT_BRANCH_EXISTS' });
    expect(classifyGitFailure(' ! [rejected]        main -> main (non-fast-forward)')).toEqual({ code: 'conflict', daytona: 'GIT_PUSH_REJECTED' });
    expect(classifyGitFailure("fatal: Authentication failed for 'https://x/'")).toEqual({ code: 'unauthorized', daytona: 'GIT_AUTH_FAILED' });
  });

  it('signs file URLs exactly as the SDK does, and refuses URLs that never expire or live too long', () => {
    // The SDK's own signing code (not exported by name; loaded next to its entry point).
    const require = createRequire(import.meta.url);
    const sdk = require(join(dirname(require.resolve('@daytonaio/sdk')), 'utils/fileUrlSigning.js')) as { computeFileUrlSignature(k: string, m: string, p: string, e: number): string };
    const now = Date.now();
    const expires = String(Math.floor(now / 1000) + 60);
    expect(fileUrlSignature('key-1', 'GET', '/root/a.txt', expires)).toBe(sdk.computeFileUrlSignature('key-1', 'GET', '/root/a.txt', Number(expires)));
    expect(() => checkExpiry(expires, 3600, now)).not.toThrow();
    // The SDK's ttlSeconds <= 0 gives expires=0, "never": refused (issue 11, finding 2).
    expect(() => checkExpiry('0', 3600, now)).toThrow(/never expires/);
    expect(() => checkExpiry(String(Math.floor(now / 1000) - 1), 3600, now)).toThrow(/expired/);
    expect(() => checkExpiry(String(Math.floor(now / 1000) + 3601), 3600, now)).toThrow(/3600 seconds/);
    expect(() => checkExpiry('soon', 3600, now)).toThrow(/unix seconds/);
  });

  it('renders states the SDK waits for, and list items without env', () => {
    const base = { id: 's', organizationId: 'o', hostId: 'local', state: 'running', image: 'default', cpu: 1, memoryMiB: 1024, env: { A: '1' }, labels: {}, timeoutSeconds: 0, expiresAt: null, createdAt: new Date(0), updatedAt: new Date(0), lastActivityAt: null, idleTimeoutSeconds: 900, idleAction: 'stop', autoDeleteSeconds: null, errorMessage: null, sourceSnapshotId: null, name: null, egress: { mode: 'allow-all' } } as unknown as Sandbox;
    const full = renderDaytonaSandbox(base, 'http://h/daytona/toolbox', { full: true, region: 'local' });
    expect(full).toMatchObject({ state: 'started', name: 's', memory: 1, autoStopInterval: 15, autoDeleteInterval: -1, env: { A: '1' }, toolboxProxyUrl: 'http://h/daytona/toolbox', target: 'local' });
    expect(renderDaytonaSandbox({ ...base, state: 'deleting' }, 'u', { full: false, region: 'local' })).toMatchObject({ state: 'destroying' });
    expect('env' in renderDaytonaSandbox(base, 'u', { full: false, region: 'local' })).toBe(false);
    // The network fields say what is in force.
    expect(full).toMatchObject({ networkBlockAll: false });
    expect(full.networkAllowList).toBeUndefined();
    expect(renderDaytonaSandbox({ ...base, egress: { mode: 'deny-all' } }, 'u', { full: false, region: 'local' })).toMatchObject({ networkBlockAll: true });
    expect(renderDaytonaSandbox({ ...base, egress: { mode: 'allow-list', allow: ['203.0.113.0/24', 'example.com', '198.51.100.7'] } }, 'u', { full: true, region: 'local' })).toMatchObject({ networkBlockAll: false, networkAllowList: '203.0.113.0/24,198.51.100.7', domainAllowList: 'example.com' });
  });

  it('renders FileInfo with ls-style mode and octal permissions, and parses both toolbox routes', () => {
    expect(daytonaFileInfo({ name: 'd', path: '/d', type: 'dir', size: 4096, mode: 0o755, mtime: 't', owner: 'root', group: 'root', uid: 0, gid: 0 })).toMatchObject({ isDir: true, mode: 'drwxr-xr-x', permissions: '0755' });
    expect(parseToolboxPath('/daytona/toolbox/abc/process/pty/p/connect')).toEqual({ sandboxId: 'abc', path: '/process/pty/p/connect' });
    expect(parseToolboxPath('/daytona/api/toolbox/abc/toolbox/process/pty/p/connect')).toEqual({ sandboxId: 'abc', path: '/process/pty/p/connect' });
    expect(parseToolboxPath('/daytona/api/sandbox')).toBeUndefined();
  });
});

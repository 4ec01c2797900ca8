// Git through the real @daytonaio/sdk 0.218 (daytona.md (c) "Git"): git runs inside the sandbox;
// with no network here, a bare repository inside the same sandbox is the remote.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DaytonaError, DaytonaNotFoundError, type Sandbox } from '@daytonaio/sdk';
import { startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

describe('Daytona git with @daytonaio/sdk', () => {
  let env: DaytonaTestEnv;
  let sb: Sandbox;
  beforeAll(async () => {
    env = await startDaytonaEnv();
    sb = await env.daytona.create();
  });
  afterAll(async () => {
    await env?.server.close();
  });

  it('inits, configures, commits, pushes to a bare remote, clones, pulls and reads status', async () => {
    await sb.git.init('/home/daytona/srv/remote.git', true, 'main');
    await sb.git.init('/home/daytona/work', false, 'main');
    await sb.git.configureUser('Ada', 'ada@example.com', 'global');
    expect(await sb.git.getConfig('user.name')).toBe('Ada');
    await sb.git.setConfig('core.autocrlf', 'false', 'local', '/home/daytona/work');
    expect(await sb.git.getConfig('core.autocrlf', 'local', '/home/daytona/work')).toBe('false');
    expect(await sb.git.getConfig('no.such-key')).toBeUndefined();
    await sb.git.remoteAdd('/home/daytona/work', 'origin', '/home/daytona/srv/remote.git');
    expect(await sb.git.remotes('/home/daytona/work')).toEqual({ remotes: [{ name: 'origin', url: '/home/daytona/srv/remote.git' }] });
    expect(await sb.git.remoteGet('/home/daytona/work', 'origin')).toBe('/home/daytona/srv/remote.git');

    await sb.fs.uploadFile(Buffer.from('one\n'), '/home/daytona/work/a.txt');
    let status = await sb.git.status('/home/daytona/work');
    expect(status.currentBranch).toBe('main');
    expect(status.fileStatus).toEqual([{ name: 'a.txt', staging: 'Untracked', worktree: 'Untracked', extra: '' }]);
    await sb.git.add('/home/daytona/work', ['a.txt']);
    status = await sb.git.status('/home/daytona/work');
    expect(status.fileStatus[0]).toMatchObject({ name: 'a.txt', staging: 'Added' });
    const commit = await sb.git.commit('/home/daytona/work', 'first commit', 'Ada', 'ada@example.com');
    expect(commit.sha).toMatch(/^[0-9a-f]{40}$/);
    await sb.git.push('/home/daytona/work', undefined, undefined, 'main', 'origin', true);
    status = await sb.git.status('/home/daytona/work');
    expect(status).toMatchObject({ currentBranch: 'main', ahead: 0, behind: 0, branchPublished: true, upstream: 'origin/main', fileStatus: [] });

    await sb.git.clone('/home/daytona/srv/remote.git', '/home/daytona/clone', 'main');
    expect((await sb.fs.downloadFile('/home/daytona/clone/a.txt')).toString()).toBe('one\n');
    const log = await sb.process.executeCommand('git -C /home/daytona/clone log --format="%H %an %s"');
    expect(log.result.trim()).toBe(`${commit.sha} Ada first commit`);

    await sb.fs.uploadFile(Buffer.from('two\n'), '/home/daytona/work/b.txt');
    await sb.git.add('/home/daytona/work', ['.']);
    const second = await sb.git.commit('/home/daytona/work', 'second', 'Ada', 'ada@example.com');
    await sb.git.push('/home/daytona/work');
    await sb.git.pull('/home/daytona/clone');
    const head = await sb.process.executeCommand('git -C /home/daytona/clone rev-parse HEAD');
    expect(head.result.trim()).toBe(second.sha);
    const empty = await sb.git.commit('/home/daytona/work', 'empty', 'Ada', 'ada@example.com', true);
    expect(empty.sha).not.toBe(second.sha);
  });

  it('creates, lists, checks out and deletes branches', async () => {
    await sb.git.createBranch('/home/daytona/work', 'feature');
    let branches = await sb.git.branches('/home/daytona/work');
    expect(branches.branches.sort()).toEqual(['feature', 'main']);
    expect((await sb.git.status('/home/daytona/work')).currentBranch).toBe('feature');
    await sb.git.checkoutBranch('/home/daytona/work', 'main');
    expect((await sb.git.status('/home/daytona/work')).currentBranch).toBe('main');
    await sb.git.deleteBranch('/home/daytona/work', 'feature');
    branches = await sb.git.branches('/home/daytona/work');
    expect(branches.branches).toEqual(['main']);
    await expect(sb.git.checkoutBranch('/home/daytona/work', 'nope')).rejects.toBeInstanceOf(DaytonaNotFoundError);
  });

  it('resets and restores', async () => {
    await sb.fs.uploadFile(Buffer.from('changed\n'), '/home/daytona/work/a.txt');
    expect((await sb.git.status('/home/daytona/work')).fileStatus).toEqual([{ name: 'a.txt', staging: 'Unmodified', worktree: 'Modified', extra: '' }]);
    await sb.git.restore('/home/daytona/work', ['a.txt']);
    expect((await sb.fs.downloadFile('/home/daytona/work/a.txt')).toString()).toBe('one\n');
    await sb.fs.uploadFile(Buffer.from('staged\n'), '/home/daytona/work/a.txt');
    await sb.git.add('/home/daytona/work', ['a.txt']);
    await sb.git.restore('/home/daytona/work', ['a.txt'], true);
    expect((await sb.git.status('/home/daytona/work')).fileStatus[0]).toMatchObject({ staging: 'Unmodified', worktree: 'Modified' });
    await sb.git.reset('/home/daytona/work', 'hard');
    expect((await sb.git.status('/home/daytona/work')).fileStatus).toEqual([]);
    expect((await sb.fs.downloadFile('/home/daytona/work/a.txt')).toString()).toBe('one\n');
  });

  it('stores credentials with git\'s store helper and reports a missing repository as not found', async () => {
    await sb.git.dangerouslyAuthenticate('user', 's3cret', 'git.example.com');
    const stored = await sb.process.executeCommand('cat /home/daytona/.git-credentials');
    expect(stored.result.trim()).toBe('https://user:s3cret@git.example.com');
    const err = await sb.git.status('/home/daytona').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DaytonaError);
    expect((err as DaytonaError).statusCode).toBe(404);
    await expect(sb.git.clone('/home/daytona/srv/missing.git', '/home/daytona/x')).rejects.toBeInstanceOf(DaytonaError);
  });
});

import { chmod, chown, lstat, mkdir, readFile, readdir, stat, symlink, writeFile } from 'node:fs/promises';
import { userInfo } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../agent-protocol/client.js';
import { FileInfo } from '../agent-protocol/types.js';
import { AccountDirectory } from './files-owners.js';
import { call, q } from './files-testing.js';
import { startTestAgent, type TestAgent } from './testing.js';

const isRoot = process.getuid?.() === 0;

describe('file metadata routes', () => {
  let agent: TestAgent;
  let client: AgentClient;

  beforeAll(async () => {
    agent = await startTestAgent();
    client = new AgentClient(agent.socketPath);
  });
  afterAll(async () => {
    client.close();
    await agent.stop();
  });

  describe('FileInfo owner and group', () => {
    it('names the owner and group from /etc/passwd and /etc/group', async () => {
      await writeFile(join(agent.home, 'owned.txt'), 'x');
      const info = FileInfo.parse((await call(client, 'GET', `/files/stat?${q({ path: 'owned.txt' })}`)).json());
      const me = userInfo();
      expect(info.uid).toBe(me.uid);
      expect(info.owner).toBe(me.username);
      expect(info.gid).toBe(process.getgid?.());
      expect(info.group).not.toBe('');
    });

    it.skipIf(!isRoot)('falls back to the number for an id without a name', async () => {
      const path = join(agent.home, 'orphan.txt');
      await writeFile(path, 'x');
      await chown(path, 54321, 54322);
      const info = (await call(client, 'GET', `/files/stat?${q({ path })}`)).json();
      expect(info).toMatchObject({ uid: 54321, gid: 54322, owner: '54321', group: '54322' });
    });

    it('parses account files and resolves names and ids', async () => {
      const dir = join(agent.root, 'etc-fixture');
      await mkdir(dir, { recursive: true });
      await writeFile(join(dir, 'passwd'), 'root:x:0:0:root:/root:/bin/bash\n# comment\nalice:x:1000:1000::/home/alice:/bin/sh\nbroken line\n');
      await writeFile(join(dir, 'group'), 'root:x:0:\ndevs:x:2000:alice\n');
      const accounts = new AccountDirectory(join(dir, 'passwd'), join(dir, 'group'));
      expect(await accounts.names(1000, 2000)).toEqual({ owner: 'alice', group: 'devs' });
      expect(await accounts.names(7, 8)).toEqual({ owner: '7', group: '8' });
      expect(await accounts.resolveUser('alice')).toBe(1000);
      expect(await accounts.resolveUser('4242')).toBe(4242);
      expect(await accounts.resolveGroup(5)).toBe(5);
      await expect(accounts.resolveUser('mallory')).rejects.toThrow(/^owner: no such user/);
      await expect(accounts.resolveGroup('nogroup-here')).rejects.toThrow(/^group: no such group/);
      // A changed file is re-read.
      await writeFile(join(dir, 'passwd'), 'root:x:0:0:root:/root:/bin/bash\nbob:x:1000:1000::/home/bob:/bin/sh\n');
      expect((await accounts.names(1000, 0)).owner).toBe('bob');
    });
  });

  describe('GET /files/list with depth', () => {
    beforeAll(async () => {
      const dir = join(agent.home, 'tree');
      await mkdir(join(dir, 'a/b/c'), { recursive: true });
      await writeFile(join(dir, 'a/one.txt'), '1');
      await writeFile(join(dir, 'a/b/two.txt'), '2');
      await writeFile(join(dir, 'a/b/c/three.txt'), '3');
      await writeFile(join(dir, 'z.txt'), 'z');
      await mkdir(join(agent.home, 'elsewhere'), { recursive: true });
      await writeFile(join(agent.home, 'elsewhere/hidden.txt'), 'h');
      await symlink(join(agent.home, 'elsewhere'), join(dir, 'linked-dir'));
    });

    const paths = async (depth?: number) => {
      const query = depth === undefined ? q({ path: 'tree' }) : q({ path: 'tree', depth });
      const response = await call(client, 'GET', `/files/list?${query}`);
      expect(response.status).toBe(200);
      return (response.json().entries as FileInfo[]).map((entry) => entry.path.slice(join(agent.home, 'tree').length + 1));
    };

    it('defaults to direct children', async () => {
      expect(await paths()).toEqual(['a', 'linked-dir', 'z.txt']);
      expect(await paths(1)).toEqual(['a', 'linked-dir', 'z.txt']);
    });

    it('includes grandchildren at depth 2 and everything at depth 32, sorted by path, never through a symlinked directory', async () => {
      expect(await paths(2)).toEqual(['a', 'a/b', 'a/one.txt', 'linked-dir', 'z.txt']);
      expect(await paths(32)).toEqual(['a', 'a/b', 'a/b/c', 'a/b/c/three.txt', 'a/b/two.txt', 'a/one.txt', 'linked-dir', 'z.txt']);
    });

    it('rejects depth 0, 33 and non-numbers naming depth', async () => {
      for (const depth of ['0', '33', 'two', '-1']) {
        const response = await call(client, 'GET', `/files/list?${q({ path: 'tree', depth })}`);
        expect(response.status).toBe(400);
        expect(response.json().error.message).toMatch(/^depth: /);
      }
    });
  });

  describe('POST /files/mkdir', () => {
    it('creates parents with 201, answers 200 when it exists, 409 for a file', async () => {
      const created = await call(client, 'POST', '/files/mkdir', { path: 'made/deep/er', mode: '750' });
      expect(created.status).toBe(201);
      expect(created.json()).toMatchObject({ path: join(agent.home, 'made/deep/er'), type: 'dir', mode: 0o750 });
      expect((await stat(join(agent.home, 'made/deep/er'))).mode & 0o777).toBe(0o750);

      const again = await call(client, 'POST', '/files/mkdir', { path: 'made/deep/er' });
      expect(again.status).toBe(200);
      expect(again.json().type).toBe('dir');

      await writeFile(join(agent.home, 'made/file'), 'x');
      const conflict = await call(client, 'POST', '/files/mkdir', { path: 'made/file' });
      expect(conflict.status).toBe(409);
      expect(conflict.json().error.code).toBe('conflict');
      const underFile = await call(client, 'POST', '/files/mkdir', { path: 'made/file/sub' });
      expect(underFile.status).toBe(409);
    });

    it('gives the directories it makes, and files a write makes, to `owner` (only what it created)', async () => {
      await mkdir(join(agent.home, 'owned-existing'));
      const made = await call(client, 'POST', '/files/mkdir', { path: 'owned-existing/a/b', owner: '54321:54322' });
      expect(made.status).toBe(201);
      for (const dir of ['owned-existing/a', 'owned-existing/a/b']) expect(await stat(join(agent.home, dir))).toMatchObject({ uid: 54321, gid: 54322 });
      expect((await stat(join(agent.home, 'owned-existing'))).uid).toBe(process.getuid!());
      const written = await call(client, 'PUT', `/files/content?${q({ path: 'owned-existing/c/d.txt', owner: '54321:54322' })}`, Buffer.from('x'), { 'content-type': 'application/octet-stream' });
      expect(written.status).toBe(200);
      for (const path of ['owned-existing/c', 'owned-existing/c/d.txt']) expect(await stat(join(agent.home, path))).toMatchObject({ uid: 54321, gid: 54322 });
      const bad = await call(client, 'POST', '/files/mkdir', { path: 'x-owner', owner: 'user' });
      expect(bad.status).toBe(400);
      expect(bad.json().error.message).toMatch(/^owner: /);
    });

    it('defaults new directories to 755 and validates mode and path', async () => {
      expect((await call(client, 'POST', '/files/mkdir', { path: 'plain-dir' })).json().mode).toBe(0o755);
      const badMode = await call(client, 'POST', '/files/mkdir', { path: 'x', mode: '999' });
      expect(badMode.status).toBe(400);
      expect(badMode.json().error.message).toMatch(/^mode: /);
      const nul = await call(client, 'POST', '/files/mkdir', { path: 'a\0b' });
      expect(nul.status).toBe(400);
      expect(nul.json().error.message).toMatch(/^path: .*NUL/);
    });
  });

  describe('POST /files/move', () => {
    it('moves, creating parents of the destination, and answers FileInfo of `to`', async () => {
      await writeFile(join(agent.home, 'to-move.txt'), 'moving');
      const moved = await call(client, 'POST', '/files/move', { from: 'to-move.txt', to: 'new/home/moved.txt' });
      expect(moved.status).toBe(200);
      expect(moved.json()).toMatchObject({ path: join(agent.home, 'new/home/moved.txt'), type: 'file', size: 6 });
      expect(await readFile(join(agent.home, 'new/home/moved.txt'), 'utf8')).toBe('moving');
      await expect(lstat(join(agent.home, 'to-move.txt'))).rejects.toThrow();
    });

    it('answers 409 when `to` exists, unless overwrite', async () => {
      await writeFile(join(agent.home, 'src.txt'), 'new');
      await writeFile(join(agent.home, 'dst.txt'), 'old');
      const refused = await call(client, 'POST', '/files/move', { from: 'src.txt', to: 'dst.txt' });
      expect(refused.status).toBe(409);
      expect(refused.json().error).toMatchObject({ code: 'conflict', message: expect.stringMatching(/^to: /) });
      expect(await readFile(join(agent.home, 'dst.txt'), 'utf8')).toBe('old');
      const forced = await call(client, 'POST', '/files/move', { from: 'src.txt', to: 'dst.txt', overwrite: true });
      expect(forced.status).toBe(200);
      expect(await readFile(join(agent.home, 'dst.txt'), 'utf8')).toBe('new');
    });

    it('moves directories, refuses moving one into itself, 404 for a missing source', async () => {
      await mkdir(join(agent.home, 'dir-a/inner'), { recursive: true });
      await writeFile(join(agent.home, 'dir-a/inner/f'), 'f');
      expect((await call(client, 'POST', '/files/move', { from: 'dir-a', to: 'dir-b' })).json().type).toBe('dir');
      expect(await readFile(join(agent.home, 'dir-b/inner/f'), 'utf8')).toBe('f');
      const intoItself = await call(client, 'POST', '/files/move', { from: 'dir-b', to: 'dir-b/inner/x' });
      expect(intoItself.status).toBe(400);
      expect(intoItself.json().error.message).toMatch(/^to: /);
      const missing = await call(client, 'POST', '/files/move', { from: 'no-such', to: 'whatever' });
      expect(missing.status).toBe(404);
      const badBody = await call(client, 'POST', '/files/move', { from: 'dir-b' });
      expect(badBody.status).toBe(400);
      expect(badBody.json().error.message).toMatch(/^to: /);
    });
  });

  describe('DELETE /files', () => {
    it('removes a file with 204 and answers 404 afterwards', async () => {
      await writeFile(join(agent.home, 'delete-me.txt'), 'x');
      expect((await call(client, 'DELETE', `/files?${q({ path: 'delete-me.txt' })}`)).status).toBe(204);
      await expect(lstat(join(agent.home, 'delete-me.txt'))).rejects.toThrow();
      const again = await call(client, 'DELETE', `/files?${q({ path: 'delete-me.txt' })}`);
      expect(again.status).toBe(404);
      expect(again.json().error.code).toBe('not_found');
    });

    it('needs recursive=true for a non-empty directory, naming recursive', async () => {
      await mkdir(join(agent.home, 'full-dir/sub'), { recursive: true });
      await writeFile(join(agent.home, 'full-dir/sub/f'), 'x');
      const refused = await call(client, 'DELETE', `/files?${q({ path: 'full-dir' })}`);
      expect(refused.status).toBe(400);
      expect(refused.json().error.message).toMatch(/^recursive: /);
      const refusedFalse = await call(client, 'DELETE', `/files?${q({ path: 'full-dir', recursive: false })}`);
      expect(refusedFalse.status).toBe(400);
      expect((await call(client, 'DELETE', `/files?${q({ path: 'full-dir', recursive: true })}`)).status).toBe(204);
      await expect(lstat(join(agent.home, 'full-dir'))).rejects.toThrow();
    });

    it('removes an empty directory without recursive, and a symlink without its target', async () => {
      await mkdir(join(agent.home, 'empty-dir'));
      expect((await call(client, 'DELETE', `/files?${q({ path: 'empty-dir' })}`)).status).toBe(204);
      await writeFile(join(agent.home, 'kept-target.txt'), 'keep');
      await symlink('kept-target.txt', join(agent.home, 'a-link'));
      expect((await call(client, 'DELETE', `/files?${q({ path: 'a-link' })}`)).status).toBe(204);
      expect(await readFile(join(agent.home, 'kept-target.txt'), 'utf8')).toBe('keep');
    });

    it('refuses to remove "/" and rejects bad parameters', async () => {
      for (const path of ['/', '/..', '/./']) {
        const response = await call(client, 'DELETE', `/files?${q({ path, recursive: true })}`);
        expect(response.status).toBe(400);
        expect(response.json().error.message).toMatch(/^path: refusing/);
      }
      expect((await call(client, 'DELETE', `/files?${q({ path: 'x', recursive: 'maybe' })}`)).json().error.message).toMatch(/^recursive: /);
      expect((await call(client, 'DELETE', '/files')).json().error.message).toBe('path: required');
      expect((await call(client, 'DELETE', '/files?path=a%00b')).json().error.message).toMatch(/^path: .*NUL/);
    });
  });

  describe('POST /files/chmod and /files/chown', () => {
    it('changes the mode and answers FileInfo', async () => {
      const path = join(agent.home, 'perm.txt');
      await writeFile(path, 'x');
      await chmod(path, 0o644);
      const response = await call(client, 'POST', '/files/chmod', { path: 'perm.txt', mode: '600' });
      expect(response.status).toBe(200);
      expect(response.json()).toMatchObject({ path, mode: 0o600 });
      expect((await stat(path)).mode & 0o7777).toBe(0o600);
      expect((await call(client, 'POST', '/files/chmod', { path: 'perm.txt', mode: 'rw' })).json().error.message).toMatch(/^mode: /);
      expect((await call(client, 'POST', '/files/chmod', { path: 'missing', mode: '600' })).status).toBe(404);
    });

    it.skipIf(!isRoot)('changes owner and group by id (65534) and by name', async () => {
      const path = join(agent.home, 'chowned.txt');
      await writeFile(path, 'x');
      const byId = await call(client, 'POST', '/files/chown', { path: 'chowned.txt', owner: 65534, group: '65534' });
      expect(byId.status).toBe(200);
      expect(byId.json()).toMatchObject({ uid: 65534, gid: 65534 });
      expect((await stat(path)).uid).toBe(65534);
      const byName = await call(client, 'POST', '/files/chown', { path: 'chowned.txt', owner: 'root' });
      expect(byName.json()).toMatchObject({ uid: 0, owner: 'root', gid: 65534 });
      const groupOnly = await call(client, 'POST', '/files/chown', { path: 'chowned.txt', group: 'root' });
      expect(groupOnly.json()).toMatchObject({ uid: 0, gid: 0, group: 'root' });
    });

    it('answers 400 naming owner or group for unknown names', async () => {
      await writeFile(join(agent.home, 'chown-bad.txt'), 'x');
      const owner = await call(client, 'POST', '/files/chown', { path: 'chown-bad.txt', owner: 'no-such-user-here' });
      expect(owner.status).toBe(400);
      expect(owner.json().error.message).toMatch(/^owner: /);
      const group = await call(client, 'POST', '/files/chown', { path: 'chown-bad.txt', group: 'no-such-group-here' });
      expect(group.status).toBe(400);
      expect(group.json().error.message).toMatch(/^group: /);
      const neither = await call(client, 'POST', '/files/chown', { path: 'chown-bad.txt' });
      expect(neither.status).toBe(400);
      expect(neither.json().error.message).toMatch(/^owner: /);
    });
  });

  it('leaves no temp files behind in home', async () => {
    const names = await readdir(agent.home);
    expect(names.filter((name) => name.endsWith('.tmp'))).toEqual([]);
  });
});

// The archive routes (archive.ts) through HttpGuestClient to the guest agent of a real
// local-driver sandbox: paths are the sandbox's own, owner names come from its /etc/passwd, and
// what createArchive streams extractArchive takes back. The extraction rules themselves are
// tested on the function (host/guest-agent/files-archive.test.ts).
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Readable } from 'node:stream';
import { Header, Parser, type ReadEntry } from 'tar';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NestboxError } from '../../core/errors.js';
import { Cgroups } from '../drivers/local/cgroups.js';
import { LocalDriver } from '../drivers/local/driver.js';
import { uniqueId } from '../drivers/local/test-support.js';
import { rawTar } from '../guest-agent/files-archive-testing.js';
import { silentLogger } from '../../core/logger.js';
import { HostAgentServer } from '../agent/server.js';
import { HttpHostClient } from '../protocol/client.js';
import { AgentClient } from './client.js';
import { HttpGuestClient } from './guest-client.js';

const IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
const REPO = resolve(import.meta.dirname, '../..');
const AGENT_BUNDLE = join(REPO, 'dist', 'guest-agent.mjs');

/** Names, kinds and link targets of a tar stream, in order. */
async function listTar(body: Readable): Promise<{ path: string; type: string; linkpath?: string; size: number }[]> {
  const entries: { path: string; type: string; linkpath?: string; size: number }[] = [];
  const parser = new Parser({ strict: true });
  parser.on('entry', (entry: ReadEntry) => {
    entries.push({ path: entry.path, type: entry.type, linkpath: entry.linkpath || undefined, size: entry.size });
    entry.resume();
  });
  await new Promise<void>((done, fail) => {
    parser.on('end', done);
    parser.on('error', fail);
    body.on('error', fail);
    body.on('data', (chunk: Buffer) => parser.write(chunk));
    body.on('end', () => parser.end());
  });
  return entries;
}

describe.skipIf(process.getuid?.() !== 0)('archive routes in a local-driver sandbox', () => {
  const dataDir = mkdtempSync('/tmp/nbxa-');
  const ownerId = uniqueId('arch');
  const id = uniqueId('arch');
  let driver: LocalDriver;
  let cgroups: Cgroups;
  let agent: AgentClient;
  let guest: HttpGuestClient;

  const sh = async (cmd: string) => {
    const result = await guest.exec({ cmd, timeoutMs: 30_000 });
    expect(result.exitCode, `${cmd}: ${result.stderr}`).toBe(0);
    return result.stdout;
  };

  beforeAll(async () => {
    if (!existsSync(AGENT_BUNDLE)) execFileSync('npm', ['run', 'build'], { cwd: REPO, stdio: 'inherit' });
    cgroups = await Cgroups.detect();
    driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, slotPoolSize: 0 });
    await driver.init();
    const runtime = await driver.create({ id, image: 'default', cpu: 1, memoryMiB: 256, env: {}, egress: { mode: 'deny-all' } });
    agent = new AgentClient(runtime.agentSocket!, { proofKey: runtime.agentProofKey });
    guest = new HttpGuestClient((r) => agent.request({ method: r.method, path: r.path, headers: r.headers, body: r.body, signal: r.signal }), () => ({ url: 'ws://unused', headers: {} }), id);
  }, 300_000);

  afterAll(async () => {
    agent?.close();
    await driver?.destroy(id).catch(() => {});
    await driver?.close();
    await cgroups?.remove(cgroups.groupFor(`nestbox/${ownerId}`)).catch(() => {});
    rmSync(dataDir, { recursive: true, force: true });
  }, 120_000);

  it("unpacks a gzip archive at a path of the sandbox, owner names from the sandbox's accounts, the mode given", async () => {
    const archive = rawTar(
      [
        { path: 'app/', type: 'Directory' },
        { path: 'app/run.sh', content: 'echo from the archive\n', mode: 0o700 },
        { path: 'app/sh', type: 'SymbolicLink', linkpath: '/bin/sh' },
      ],
      { gzip: true },
    );
    const result = await guest.extractArchive({ path: '/srv/ctx', owner: 'user', mode: '0750', body: Readable.from([archive]) });
    expect(result).toEqual({ entries: 3, bytes: 22 });
    expect(await sh('stat -c "%n %U:%G %a" /srv/ctx/app /srv/ctx/app/run.sh; readlink /srv/ctx/app/sh; stat -c "%U" -L /bin/sh; /srv/ctx/app/sh /srv/ctx/app/run.sh')).toBe(
      '/srv/ctx/app user:user 750\n/srv/ctx/app/run.sh user:user 750\n/bin/sh\nroot\nfrom the archive\n',
    );
    // An unknown name is the caller's mistake, named.
    const unknown = await guest.extractArchive({ path: '/srv/ctx', owner: 'nosuchuser', body: Readable.from([archive]) }).catch((e: unknown) => e);
    expect(unknown).toBeInstanceOf(NestboxError);
    expect((unknown as NestboxError).code).toBe('validation_failed');
    expect((unknown as NestboxError).message).toMatch(/^owner: /);
  });

  it('refuses an archive whose entries leave the path, and writes nothing outside it', async () => {
    for (const name of ['../../etc/escaped', '/etc/escaped']) {
      const error = await guest.extractArchive({ path: '/srv/evil', body: Readable.from([rawTar([{ path: name, content: 'x' }])]) }).catch((e: unknown) => e);
      expect((error as NestboxError).code, name).toBe('validation_failed');
      expect((error as NestboxError).message).toMatch(/^body: entry/);
    }
    const through = await guest
      .extractArchive({ path: '/srv/evil', body: Readable.from([rawTar([{ path: 'etc', type: 'SymbolicLink', linkpath: '/etc' }, { path: 'etc/escaped', content: 'x' }])]) })
      .catch((e: unknown) => e);
    expect((through as NestboxError).code).toBe('validation_failed');
    expect(await sh('ls /etc/escaped 2>&1 || echo absent')).toMatch(/absent\n$/);
  });

  it('streams a tree back with names relative to the root, symlinks as links; a missing path is not_found', async () => {
    await sh('mkdir -p /srv/tree/sub && echo one > /srv/tree/one && ln -s /etc/hostname /srv/tree/sub/link && ln -s /srv/tree /srv/tree-link');
    const stream = await guest.createArchive({ path: '/srv/tree' });
    expect(stream.headers.contentType).toBe('application/x-tar');
    const entries = await listTar(stream.body);
    expect(entries.map((e) => e.path).sort()).toEqual(['srv/tree/', 'srv/tree/one', 'srv/tree/sub/', 'srv/tree/sub/link']);
    expect(entries.find((e) => e.path === 'srv/tree/sub/link')).toMatchObject({ type: 'SymbolicLink', linkpath: '/etc/hostname', size: 0 });
    // A symlink named as the path is archived as the link, not what it points at.
    expect(await listTar((await guest.createArchive({ path: '/srv/tree-link' })).body)).toEqual([{ path: 'srv/tree-link', type: 'SymbolicLink', linkpath: '/srv/tree', size: 0 }]);
    // Relative paths resolve against the home, as every file route's do.
    await sh('echo hi > "$HOME/note"');
    expect((await listTar((await guest.createArchive({ path: 'note' })).body)).map((e) => e.path)).toEqual(['root/note']);
    const missing = await guest.createArchive({ path: '/srv/nope' }).catch((e: unknown) => e);
    expect((missing as NestboxError).code).toBe('not_found');
    // What comes out goes back in: COPY --from's round trip.
    const copied = await guest.extractArchive({ path: '/copy', body: (await guest.createArchive({ path: '/srv/tree' })).body });
    expect(copied.entries).toBe(4);
    expect(await sh('cat /copy/srv/tree/one; readlink /copy/srv/tree/sub/link')).toBe('one\n/etc/hostname\n');
  });

  it('works through the host agent as core calls it (HostClient.guest), a refusal arriving while the body is still sent', async () => {
    const secret = 'a-host-secret-of-enough-length';
    const server = new HostAgentServer({ hostId: 'h1', secret, driver, logger: silentLogger });
    const port = await server.listen(0, '127.0.0.1');
    try {
      const viaHost = new HttpHostClient({ hostId: 'h1', baseUrl: `http://127.0.0.1:${port}`, secret }).guest(id);
      const archive = rawTar([{ path: 'hop/f', content: 'through the host agent' }], { gzip: true });
      expect(await viaHost.extractArchive({ path: '/srv', body: Readable.from([archive]) })).toEqual({ entries: 1, bytes: 22 });
      expect((await listTar((await viaHost.createArchive({ path: '/srv/hop' })).body)).map((e) => e.path)).toEqual(['srv/hop/', 'srv/hop/f']);
      // Refused at its first entry, with 32 MiB still to come: the 400 gets through, not a broken pipe.
      async function* refusedThenMore(): AsyncGenerator<Buffer> {
        yield rawTar([{ path: '../escape', content: 'x' }]).subarray(0, 1024);
        for (let i = 0; i < 32; i++) yield Buffer.alloc(1024 * 1024);
      }
      const refused = await viaHost.extractArchive({ path: '/srv', body: Readable.from(refusedThenMore()) }).catch((e: unknown) => e);
      expect(refused).toBeInstanceOf(NestboxError);
      expect((refused as NestboxError).code).toBe('validation_failed');
      expect((refused as NestboxError).message).toMatch(/^body: entry "\.\.\/escape"/);
      // The connection is still usable.
      expect((await viaHost.exec({ cmd: 'cat /srv/hop/f', timeoutMs: 20_000 })).stdout).toBe('through the host agent');
    } finally {
      await server.close();
    }
  });

  it('streams large bodies both ways, and stops a walk whose client went away', async () => {
    const MiB = 1024 * 1024;
    // 48 MiB of file content, generated as it is sent (never one buffer).
    async function* big(): AsyncGenerator<Buffer> {
      // The header of a 48 MiB file (taken from a 1-block archive and given the size), then
      // its content a MiB at a time, then the end blocks.
      const header = new Header({ path: 'big.bin', type: 'File', size: 48 * MiB, mode: 0o644, uid: 0, gid: 0, mtime: new Date() });
      const block = Buffer.alloc(512);
      header.encode(block, 0);
      yield block;
      for (let i = 0; i < 48; i++) yield Buffer.alloc(MiB, 1);
      yield Buffer.alloc(1024);
    }
    expect(await guest.extractArchive({ path: '/srv/big', body: Readable.from(big()) })).toEqual({ entries: 1, bytes: 48 * MiB });
    const back = await guest.createArchive({ path: '/srv/big' });
    let bytes = 0;
    for await (const chunk of back.body) bytes += (chunk as Buffer).length;
    expect(bytes).toBeGreaterThan(48 * MiB);

    // A walk of /usr abandoned after its first chunk: the agent carries on answering.
    const controller = new AbortController();
    const walk = await guest.createArchive({ path: '/usr' }, { signal: controller.signal });
    await new Promise<void>((done) => walk.body.once('data', () => done()));
    controller.abort();
    walk.body.destroy();
    expect(await sh('echo still here')).toBe('still here\n');
  });
});

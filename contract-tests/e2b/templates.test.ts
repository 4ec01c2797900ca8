// E2B's Template builder through the real SDK (e2b-wave2.md §1): a template is built into a
// Nestbox image by real build sandboxes (COPY through the upload links, RUN, ENV, WORKDIR, USER,
// a start command with its ready check), and sandboxes start from it by name or name:tag.
// Builds start from `fromTemplate('base')` / `fromBaseImage()` (Nestbox's built-in image) and
// their steps need no network; sandboxes get no internet either.
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BuildError, Sandbox, Template, waitForPort, type LogEntry } from 'e2b';
import { Template as LegacyTemplate } from 'e2b-legacy';
import { sleep, startE2bTestServer, type E2bTestServer } from './helpers.js';

let t: E2bTestServer;
let context: string;
const sandboxes: Sandbox[] = [];
/** Build sandboxes may not reach out: only steps that need no network run here. */
const NO_EGRESS = { apiHeaders: { 'x-nestbox-build-egress': 'deny-all' } };
const BUILD_TIMEOUT = 600_000;

async function start(template: string): Promise<Sandbox> {
  const sbx = await Sandbox.create(template, { ...t.opts, allowInternetAccess: false });
  sandboxes.push(sbx);
  return sbx;
}

function mainTemplate() {
  return Template({ fileContextPath: context })
    .fromTemplate('base')
    .copy('app', '/home/user/app/')
    .copy('config.txt', '/etc/demo-config.txt', { mode: 0o640, user: 'root' })
    .runCmd(['echo built > /home/user/built.txt', 'whoami > /home/user/whoami.txt'])
    .runCmd('id -un > /home/user/root-ran.txt', { user: 'root' })
    .setEnvs({ GREETING: 'hello "world"', BASE_DIR: '/opt/demo' })
    .setEnvs({ TOOLS: '$BASE_DIR/tools', PATH: '$PATH:/opt/demo/bin' })
    .runCmd('ls / > /dev/null && printenv PATH > /home/user/path.txt')
    .setWorkdir('/home/user/app')
    .setUser('user')
    .setStartCmd('python3 -m http.server 8000', waitForPort(8000));
}

beforeAll(async () => {
  t = await startE2bTestServer();
  context = mkdtempSync(path.join(tmpdir(), 'nbx-e2b-tpl-'));
  mkdirSync(path.join(context, 'app/sub'), { recursive: true });
  writeFileSync(path.join(context, 'app/a.txt'), 'alpha\n');
  writeFileSync(path.join(context, 'app/sub/b.txt'), 'beta\n');
  writeFileSync(path.join(context, 'config.txt'), 'key=value\n');
}, 120_000);

afterAll(async () => {
  for (const s of sandboxes) await s.kill().catch(() => undefined);
  rmSync(context, { recursive: true, force: true });
  await t?.close();
});

describe('e2b Template.build', () => {
  it('builds copy, runCmd, setEnvs, setWorkdir, setUser and a start command; Sandbox.create(name) runs it', async () => {
    const logs: LogEntry[] = [];
    const info = await Template.build(mainTemplate(), 'tpl-main', { ...t.opts, ...NO_EGRESS, onBuildLogs: (e) => logs.push(e) });
    expect(info).toMatchObject({ name: 'tpl-main', templateId: 'tpl-main', tags: ['default'] });
    const text = logs.map((l) => l.message).join('\n');
    // The SDK's own entries and the server's step lines both reach onBuildLogs.
    expect(text).toContain("Uploaded 'app'");
    expect(text).toMatch(/Step \d+\/\d+ : COPY app \/home\/user\/app\//);
    expect(text).toMatch(/Step \d+\/\d+ : RUN echo built/);
    expect(text).toContain('Build finished');

    const sbx = await start('tpl-main');
    const files = await sbx.commands.run('cat /home/user/app/a.txt /home/user/app/sub/b.txt /home/user/built.txt /home/user/whoami.txt /home/user/root-ran.txt; stat -c "%U %a" /etc/demo-config.txt /home/user/app/a.txt /home/user/app/sub; whoami', { user: 'root' });
    expect(files.stdout).toBe('alpha\nbeta\nbuilt\nuser\nroot\nroot 640\nuser 644\nuser 755\nroot\n');
    // The template's last user and workdir are the sandbox's defaults (E2B's "User and workdir").
    expect((await sbx.commands.run('whoami; pwd; cat /etc/demo-config.txt || true')).stdout).toBe('user\n/home/user/app\n');
    const env = await sbx.commands.run('printf "%s|%s" "$GREETING" "$TOOLS"');
    // Values are literal but for references to the template's own variables (Docker's ENV rule).
    expect(env.stdout).toBe('hello "world"|/opt/demo/tools');
    // `$PATH` is the base image's PATH, as upstream's base image has one: the build still finds `ls`.
    expect(await sbx.files.read('/home/user/path.txt')).toBe('/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/demo/bin\n');
    // The start command runs in every sandbox of the template, ready before the create answered.
    // …as the template's user, in its workdir (the server serves /home/user/app).
    const served = await sbx.commands.run('curl -s http://127.0.0.1:8000/a.txt; ps -o user= -C python3 | sort -u');
    expect(served.stdout).toBe('alpha\nuser\n');
    const listed = await Sandbox.list({ ...t.opts, query: { template: 'tpl-main' } } as never).nextItems();
    expect(listed.map((s) => s.sandboxId)).toContain(sbx.sandboxId);
    expect(listed.find((s) => s.sandboxId === sbx.sandboxId)?.templateId).toBe('tpl-main');
  }, BUILD_TIMEOUT);

  it('answers an unchanged rebuild from the cache, and rebuilds with skipCache', async () => {
    const cached: string[] = [];
    await Template.build(mainTemplate(), 'tpl-main', { ...t.opts, ...NO_EGRESS, onBuildLogs: (e) => cached.push(e.message) });
    expect(cached.join('\n')).toContain('Using cache');
    expect(cached.join('\n')).toContain("Skipping upload of 'app', already cached");
    const fresh: string[] = [];
    await Template.build(mainTemplate(), 'tpl-main', { ...t.opts, ...NO_EGRESS, skipCache: true, onBuildLogs: (e) => fresh.push(e.message) });
    expect(fresh.join('\n')).not.toContain('Using cache');
    expect(fresh.join('\n')).toMatch(/Step \d+\/\d+ : RUN echo built/);
  }, BUILD_TIMEOUT);

  it('tells which templates exist, and assigns, lists and removes tags', async () => {
    expect(await Template.exists('tpl-main', t.opts)).toBe(true);
    expect(await Template.exists('tpl-main:default', t.opts)).toBe(true);
    expect(await Template.exists('tpl-nothing', t.opts)).toBe(false);
    expect(await Template.exists('tpl-main:v2', t.opts)).toBe(false);

    const assigned = await Template.assignTags('tpl-main:default', ['v2', 'stable'], t.opts);
    expect(assigned.tags).toEqual(['v2', 'stable']);
    expect(assigned.buildId).toMatch(/^bld/);
    const tags = await Template.getTags('tpl-main', t.opts);
    expect(tags.map((x) => x.tag).sort()).toEqual(['default', 'stable', 'v2']);
    for (const tag of tags) {
      expect(tag.buildId).toBe(assigned.buildId);
      expect(tag.createdAt).toBeInstanceOf(Date);
      expect(Number.isNaN(tag.createdAt.getTime())).toBe(false);
    }
    expect(await Template.exists('tpl-main:v2', t.opts)).toBe(true);

    const sbx = await start('tpl-main:v2');
    expect((await sbx.commands.run('cat /home/user/built.txt')).stdout).toBe('built\n');

    await Template.removeTags('tpl-main', 'stable', t.opts);
    expect((await Template.getTags('tpl-main', t.opts)).map((x) => x.tag).sort()).toEqual(['default', 'v2']);
    expect(await Template.exists('tpl-main:stable', t.opts)).toBe(false);
    await expect(Sandbox.create('tpl-main:stable', t.opts)).rejects.toThrow(/not found/);
  }, BUILD_TIMEOUT);

  it('builds fromTemplate(a template built here) with makeDir, makeSymlink, rename, remove and gitClone', async () => {
    const template = Template({ fileContextPath: context })
      .fromTemplate('tpl-main')
      .makeDir(['/home/user/made/deep'], { mode: 0o750 })
      .makeSymlink('/home/user/built.txt', '/home/user/made/link')
      .runCmd('echo gone > /home/user/gone.txt && echo old > /home/user/old.txt')
      .remove('/home/user/gone.txt')
      .rename('/home/user/old.txt', '/home/user/new.txt')
      // A local repository: the build has no network.
      .runCmd('git init -q /tmp/src && git -C /tmp/src -c user.email=t@example.com -c user.name=t commit -q --allow-empty -m first')
      .gitClone('/tmp/src', '/home/user/cloned', { depth: 1 });
    await Template.build(template, 'tpl-child', { ...t.opts, ...NO_EGRESS });
    const sbx = await start('tpl-child');
    const r = await sbx.commands.run('stat -c %a made/deep; readlink made/link; cat made/link new.txt; test ! -e gone.txt && echo removed; git -C cloned log --format=%s; pwd', { cwd: '/home/user' });
    expect(r.stdout).toBe('750\n/home/user/built.txt\nbuilt\nold\nremoved\nfirst\n/home/user\n');
    // The parent's files, environment, workdir and start command come along.
    expect((await sbx.commands.run('cat /home/user/app/a.txt; echo $GREETING; pwd; curl -s http://127.0.0.1:8000/a.txt')).stdout).toBe('alpha\nhello "world"\n/home/user/app\nalpha\n');
    await expect(Template.build(Template().fromTemplate('tpl-no-such'), 'tpl-orphan', { ...t.opts, ...NO_EGRESS })).rejects.toThrow(/template tpl-no-such not found/);
  }, BUILD_TIMEOUT);

  it('builds in the background, with getBuildStatus polling until ready', async () => {
    const template = Template({ fileContextPath: context }).fromBaseImage().runCmd('echo background > /home/user/bg.txt').setUser('root').setWorkdir('/opt/bg');
    const info = await Template.buildInBackground(template, 'tpl-bg:v1', { ...t.opts, ...NO_EGRESS });
    expect(info).toMatchObject({ name: 'tpl-bg:v1', templateId: 'tpl-bg', tags: ['v1'] });
    const seen: string[] = [];
    let offset = 0;
    let status = await Template.getBuildStatus(info, { ...t.opts, logsOffset: offset });
    expect(['waiting', 'building', 'ready']).toContain(status.status);
    const deadline = Date.now() + BUILD_TIMEOUT - 30_000;
    for (let i = 0; i < 5000 && Date.now() < deadline; i++) {
      offset += status.logEntries.length;
      seen.push(...status.logEntries.map((e) => e.message));
      if (status.status !== 'waiting' && status.status !== 'building' && status.logEntries.length === 0) break;
      await sleep(200);
      status = await Template.getBuildStatus(info, { ...t.opts, logsOffset: offset });
    }
    expect(status.status).toBe('ready');
    expect(status.buildID).toBe(info.buildId);
    expect(seen.join('\n')).toMatch(/RUN echo background/);
    // Past the end: nothing more (the SDK's drain loop ends on an empty page).
    expect((await Template.getBuildStatus(info, { ...t.opts, logsOffset: offset + 50 })).logEntries).toEqual([]);
    const sbx = await start('tpl-bg:v1');
    expect((await sbx.commands.run('cat /home/user/bg.txt; whoami; pwd')).stdout).toBe('background\nroot\n/opt/bg\n');
    expect((await sbx.commands.run('whoami; pwd', { user: 'user' })).stdout).toBe('user\n/opt/bg\n');
  }, BUILD_TIMEOUT);

  it('fails a build whose runCmd fails with BuildError pointing at that runCmd', async () => {
    const template = Template({ fileContextPath: context })
      .fromTemplate('base')
      .runCmd('echo fine')
      .runCmd('echo about to fail; exit 3'); // <- the failing call
    const err = await Template.build(template, 'tpl-fails', { ...t.opts, ...NO_EGRESS }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BuildError);
    expect((err as Error).message).toMatch(/non-zero code: 3/);
    // The SDK maps reason.step onto the stack frame of the builder call that failed.
    expect((err as Error).stack).toContain('templates.test.ts');
    expect(await Template.exists('tpl-fails', t.opts)).toBe(false);
  }, BUILD_TIMEOUT);

  it('builds fromDockerfile (single stage); a multi-stage Dockerfile is refused by the SDK', async () => {
    const dockerfile = 'FROM e2bdev/base\nENV MODE=docker\nWORKDIR /srv\nRUN echo "$MODE" > mode.txt\nUSER user\n';
    await Template.build(Template({ fileContextPath: context }).fromDockerfile(dockerfile), 'tpl-docker', { ...t.opts, ...NO_EGRESS });
    const sbx = await start('tpl-docker');
    expect((await sbx.commands.run('cat /srv/mode.txt; whoami; echo $MODE')).stdout).toBe('docker\nuser\ndocker\n');
    expect(() => Template().fromDockerfile('FROM e2bdev/base AS a\nRUN true\nFROM e2bdev/base\nCOPY --from=a /x /x\n')).toThrow(/[Mm]ulti-stage/);

    // DELETE /templates/{id} (the CLI's template delete): refused while a sandbox uses it.
    const remove = () => fetch(`${t.opts.apiUrl}/templates/tpl-docker`, { method: 'DELETE', headers: { 'X-API-KEY': t.opts.apiKey } });
    expect((await remove()).status).toBe(409);
    await sbx.kill();
    expect((await remove()).status).toBe(204);
    expect(await Template.exists('tpl-docker', t.opts)).toBe(false);
    expect((await remove()).status).toBe(404);
  }, BUILD_TIMEOUT);
});

describe('e2b Template aptInstall', () => {
  it("installs a small Debian package (the build's egress limited to Debian's mirror)", async () => {
    const template = Template({ fileContextPath: context }).fromTemplate('base').aptInstall(['cowsay'], { noInstallRecommends: true });
    await Template.build(template, 'tpl-apt', { ...t.opts, apiHeaders: { 'x-nestbox-build-egress': 'deb.debian.org' } });
    const sbx = await start('tpl-apt');
    expect((await sbx.commands.run('/usr/games/cowsay moo')).stdout).toContain('< moo >');
  }, BUILD_TIMEOUT);
});

// 2.6 sends no extra headers, so its build keeps the default egress; its steps need no network.
describe('e2b 2.6 Template.build (alias)', () => {
  it('builds with the older request body ({alias}) and the same later calls', async () => {
    const logs: string[] = [];
    const template = LegacyTemplate({ fileContextPath: context }).fromTemplate('base').copy('config.txt', '/home/user/legacy.txt').runCmd('echo legacy >> /home/user/legacy.txt');
    // 2.6 builds its client from apiKey and domain only: the API URL comes from the environment.
    const saved = process.env.E2B_API_URL;
    process.env.E2B_API_URL = t.opts.apiUrl;
    try {
      await LegacyTemplate.build(template, { apiKey: t.opts.apiKey, alias: 'tpl-legacy', onBuildLogs: (e) => logs.push(e.message) });
    } finally {
      if (saved === undefined) delete process.env.E2B_API_URL;
      else process.env.E2B_API_URL = saved;
    }
    expect(logs.join('\n')).toMatch(/RUN echo legacy/);
    const sbx = await start('tpl-legacy');
    expect((await sbx.commands.run('cat /home/user/legacy.txt; stat -c %U /home/user/legacy.txt')).stdout).toBe('key=value\nlegacy\nuser\n');
  }, BUILD_TIMEOUT);
});

describe('e2b template routes, on the wire', () => {
  const api = (p: string, init: RequestInit = {}) =>
    fetch(`${t.opts.apiUrl}${p}`, { ...init, headers: { 'X-API-KEY': t.opts.apiKey, 'content-type': 'application/json', ...(init.headers ?? {}) } });

  it('refuses a step the SDK never sends (a Dockerfile FROM, a second stage) with a 400 naming it', async () => {
    const requested = await (await api('/v3/templates', { method: 'POST', body: JSON.stringify({ name: 'tpl-raw' }) })).json();
    expect(requested).toMatchObject({ templateID: 'tpl-raw', tags: ['default'] });
    const res = await api(`/v2/templates/tpl-raw/builds/${requested.buildID}`, {
      method: 'POST',
      body: JSON.stringify({ fromTemplate: 'base', force: false, steps: [{ type: 'RUN', args: ['true'], force: false }, { type: 'FROM', args: ['debian'], force: false }] }),
    });
    expect(res.status).toBe(400);
    expect(await res.json()).toMatchObject({ code: 400, message: expect.stringContaining('steps[1].type') });
    // Before its start, the build waits and has no logs.
    const status = await (await api(`/templates/tpl-raw/builds/${requested.buildID}/status`)).json();
    expect(status).toMatchObject({ status: 'waiting', logEntries: [] });
    expect((await api(`/templates/tpl-raw/builds/${requested.buildID}/status?level=info`)).status).toBe(501);
    // A build sandbox larger than the server allows: a 400 under E2B's field name.
    const big = await (await api('/v3/templates', { method: 'POST', body: JSON.stringify({ name: 'tpl-big', cpuCount: 4096 }) })).json();
    const refused = await api(`/v2/templates/tpl-big/builds/${big.buildID}`, { method: 'POST', body: JSON.stringify({ fromTemplate: 'base', force: false, steps: [] }) });
    expect(refused.status).toBe(400);
    expect((await refused.json()).message).toMatch(/^cpuCount: /);
  });

  it('refuses minFreeDiskMb above 0 (501), and takes 0', async () => {
    const grow = await api('/v3/templates', { method: 'POST', body: JSON.stringify({ name: 'tpl-disk', minFreeDiskMb: 2048 }) });
    expect(grow.status).toBe(501);
    expect((await grow.json()).message).toContain('minFreeDiskMb');
    expect((await api('/v3/templates', { method: 'POST', body: JSON.stringify({ name: 'tpl-disk', minFreeDiskMb: 0 }) })).status).toBe(202);
  });

  it('refuses a malformed build egress header with a 400 naming it', async () => {
    const res = await api('/v3/templates', { method: 'POST', body: JSON.stringify({ name: 'tpl-egress' }), headers: { 'x-nestbox-build-egress': 'not a host!' } });
    expect(res.status).toBe(400);
    expect((await res.json()).message).toContain('x-nestbox-build-egress');
  });

  it('takes uploads only through the link it handed out', async () => {
    const hash = 'a'.repeat(64);
    const link = await (await api(`/templates/tpl-raw/files/${hash}`)).json();
    expect(link).toMatchObject({ present: false, url: expect.stringContaining(`/e2b/template-files/`) });
    const forged = new URL(link.url);
    forged.searchParams.set('token', 'x'.repeat(43));
    expect((await fetch(forged, { method: 'PUT', body: 'nope' })).status).toBe(401);
    expect((await fetch(link.url.replace(/\?.*$/, ''), { method: 'PUT', body: 'nope' })).status).toBe(401);
    expect((await fetch(link.url, { method: 'PUT', body: 'tar bytes' })).status).toBe(200);
    expect(await (await api(`/templates/tpl-raw/files/${hash}`)).json()).toMatchObject({ present: true });
    // A link is used once.
    expect((await fetch(link.url, { method: 'PUT', body: 'again' })).status).toBe(401);
    expect((await api('/templates/tpl-raw/files/not-a-hash')).status).toBe(400);
  });
});

// E2B's `fromImage(image, {username, password})` through the real SDK: the base is pulled from a
// private registry (Debian's docker-registry on loopback, basic auth) with the build's own
// credentials; the image gets E2B's `user` account (a busybox image has no useradd: the account
// files are written) and the steps run as it. Wrong credentials fail the build at its base.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BuildError, Sandbox, Template } from 'e2b';
import { buildTestImage, busyboxImageSpec, pushTestImage, startTestRegistry, type TestRegistry } from '../../host/images/oci/test-registry.js';
import { startE2bTestServer, type E2bTestServer } from './helpers.js';

const CREDENTIALS = { username: 'puller', password: 'pull-secret' };
const NO_EGRESS = { apiHeaders: { 'x-nestbox-build-egress': 'deny-all' } };
let t: E2bTestServer;
let registry: TestRegistry;
let work: string;
let reference: string;

beforeAll(async () => {
  work = mkdtempSync(path.join(tmpdir(), 'nbx-e2b-reg-'));
  registry = await startTestRegistry({ htpasswd: CREDENTIALS });
  const applets = Object.fromEntries(['mkdir', 'chown'].map((a) => [`bin/${a}`, { symlink: 'busybox' }]));
  const spec = busyboxImageSpec({ env: ['PATH=/bin'], files: { ...applets, 'etc/passwd': { content: 'root:x:0:0:root:/root:/bin/sh\n' }, 'etc/group': { content: 'root:x:0:\n' } } });
  reference = `${registry.host}/e2b/busybox:1`;
  await pushTestImage(await buildTestImage(path.join(work, 'busybox'), spec), reference, CREDENTIALS);
  t = await startE2bTestServer();
}, 300_000);

afterAll(async () => {
  await t?.close();
  await registry?.stop();
  rmSync(work, { recursive: true, force: true });
});

describe('e2b Template fromImage with registry credentials', () => {
  it('pulls the base with the credentials, adds the user account, and runs the steps as it', async () => {
    const template = Template({ fileContextPath: work }).fromImage(reference, CREDENTIALS).runCmd('echo from-registry > r.txt; id -un > who.txt; pwd > where.txt');
    await Template.build(template, 'tpl-registry', { ...t.opts, ...NO_EGRESS });
    const sbx = await Sandbox.create('tpl-registry', { ...t.opts, allowInternetAccess: false });
    try {
      expect(await sbx.files.read('/home/user/r.txt')).toBe('from-registry\n');
      expect(await sbx.files.read('/home/user/who.txt')).toBe('user\n');
      expect(await sbx.files.read('/home/user/where.txt')).toBe('/home/user\n');
    } finally {
      await sbx.kill();
    }
  }, 600_000);

  it('fails at the base with wrong credentials', async () => {
    const template = Template({ fileContextPath: work }).fromImage(reference, { username: CREDENTIALS.username, password: 'wrong' }).runCmd('true');
    const err = await Template.build(template, 'tpl-registry-bad', { ...t.opts, ...NO_EGRESS }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BuildError);
    expect((err as Error).message).toMatch(new RegExp(`FROM ${reference.replace(/[.]/g, '\\.')}`));
    // reason.step "base": the SDK points at the fromImage call.
    expect((err as Error).stack).toContain('templates-registry.test.ts');
  }, 600_000);
});

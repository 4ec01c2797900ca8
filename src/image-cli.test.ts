// `nestbox image pull|list` end to end: the configuration (store dir, mirrors) as the CLI reads
// it, credentials from stdin, and errors as one readable line. Debian's registry on loopback.
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildTestImage, busyboxImageSpec, pushTestImage, startTestRegistry, type TestRegistry } from '../host/images/oci/test-registry.js';

const CLI = resolve(import.meta.dirname, '../dist/src/cli.js');
const CREDS = { username: 'cli', password: 'from stdin only' };

function cli(args: string[], env: Record<string, string>, stdin?: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolveRun) => {
    const child = execFile(process.execPath, [CLI, ...args], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env }, timeout: 120_000 }, (error, stdout, stderr) => {
      resolveRun({ code: error ? ((error as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
    child.stdin?.end(stdin ?? '');
  });
}

describe('nestbox image pull / list', () => {
  let dir: string;
  let registry: TestRegistry;
  let authRegistry: TestRegistry;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'nestbox-image-cli-'));
    [registry, authRegistry] = await Promise.all([startTestRegistry(), startTestRegistry({ htpasswd: CREDS })]);
    const layout = await buildTestImage(join(dir, 'busybox'), busyboxImageSpec());
    await pushTestImage(layout, `${registry.host}/test/busybox:1`);
    await pushTestImage(layout, `${authRegistry.host}/private/busybox:1`, CREDS);
  }, 300_000);

  afterAll(async () => {
    await Promise.all([registry?.stop(), authRegistry?.stop()]);
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('pulls through the configured mirror into the configured store and lists it', async () => {
    const env = { NESTBOX_DATA_DIR: join(dir, 'data'), NESTBOX_OCI_STORE_DIR: join(dir, 'store'), NESTBOX_REGISTRY_MIRRORS: `127.0.0.2:9=${registry.host}` };
    const pulled = await cli(['image', 'pull', '127.0.0.2:9/test/busybox:1'], env);
    expect(pulled.stderr).toContain('ready in');
    expect(pulled).toMatchObject({ code: 0, stdout: expect.stringMatching(/^sha256:[a-f0-9]{64}\n$/) });
    const listed = await cli(['image', 'list'], env);
    expect(listed.code).toBe(0);
    expect(JSON.parse(listed.stdout.trim())).toMatchObject({ id: pulled.stdout.trim(), reference: '127.0.0.2:9/test/busybox:1' });
  });

  it('takes the password on stdin only, and says unauthorized without it', async () => {
    const env = { NESTBOX_DATA_DIR: join(dir, 'data'), NESTBOX_OCI_STORE_DIR: join(dir, 'auth-store') };
    const ref = `${authRegistry.host}/private/busybox:1`;
    const anonymous = await cli(['image', 'pull', ref], env);
    expect(anonymous.code).toBe(1);
    expect(anonymous.stderr).toMatch(/^unauthorized: /);
    expect((await cli(['image', 'pull', ref, '--username', CREDS.username], env)).stderr).toContain('--password-stdin');
    const pulled = await cli(['image', 'pull', ref, '--username', CREDS.username, '--password-stdin'], env, `${CREDS.password}\n`);
    expect(pulled).toMatchObject({ code: 0, stdout: expect.stringMatching(/^sha256:/) });
  });

  it('answers a missing tag and a bad reference in one line each', async () => {
    const env = { NESTBOX_DATA_DIR: join(dir, 'data'), NESTBOX_OCI_STORE_DIR: join(dir, 'store') };
    const missing = await cli(['image', 'pull', `${registry.host}/test/busybox:nope`], env);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/^not_found: .*manifest unknown/);
    const bad = await cli(['image', 'pull', 'Not A Reference'], env);
    expect(bad.stderr).toMatch(/^validation_failed: image reference/);
  });
});

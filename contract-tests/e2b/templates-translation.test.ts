// E2B's start-build body → BuildSpec (compat/e2b/template-spec.ts), without a server: each step
// keeps the SDK's step index as its line (so a failure reports the user's builder call), E2B's
// defaults come first, literal values stay literal, and bad bodies are 400s naming the field.
// The bodies are the SDK's own: Template.toJSON of real builders.
import { describe, expect, it } from 'vitest';
import { Template, waitForPort } from 'e2b';
import { NestboxError } from '../../core/errors.js';
import { e2bStepOf, templateBuildRequest } from '../../compat/e2b/template-spec.js';

const sdkBody = async (template: unknown) => JSON.parse(await Template.toJSON(template as never, false)) as Record<string, unknown>;

function refusal(fn: () => unknown): NestboxError {
  try {
    fn();
  } catch (err) {
    if (err instanceof NestboxError) return err;
    throw err;
  }
  throw new Error('not refused');
}

describe('E2B template steps onto a BuildSpec', () => {
  it('keeps the SDK step index as the line, E2B defaults as base steps, and the start command last', async () => {
    const body = await sdkBody(
      Template()
        .fromBaseImage()
        .runCmd('echo "a b" > /tmp/x', { user: 'root' })
        .setEnvs({ Q: 'say "hi" \\ $HOME' })
        .setWorkdir('/srv')
        .setUser('guest')
        .setStartCmd('python3 -m http.server 9000', waitForPort(9000)),
    );
    const { spec, noCache } = templateBuildRequest(body, { kind: 'builtin' });
    expect(noCache).toBe(false);
    const steps = spec.stages[0].steps;
    expect(spec.stages[0].from.reference).toBe('default');
    expect(steps.map((s) => [s.kind, s.at.line])).toEqual([
      ['env', 0],
      ['user', 0],
      ['workdir', 0],
      ['run', 1],
      ['env', 2],
      ['workdir', 3],
      ['user', 4],
      ['start', 5],
    ]);
    expect(steps[0]).toMatchObject({ kind: 'env', vars: [['PATH', '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin']] });
    expect(steps[3]).toMatchObject({ kind: 'run', command: { shell: 'echo "a b" > /tmp/x' }, user: 'root' });
    // Quotes and backslashes are literal; `$VAR` keeps its Dockerfile meaning.
    expect(steps[4]).toMatchObject({ kind: 'env', vars: [['Q', 'say \\"hi\\" \\\\ $HOME']] });
    expect(steps[7]).toMatchObject({ kind: 'start', command: 'python3 -m http.server 9000', ready: { kind: 'command', command: '[ -n "$(ss -Htuln sport = :9000)" ]' } });
    // A failure's step number (1-based over the spec) back to E2B's reason.step.
    expect([0, 1, 4, 5, 8, 'finalize' as const].map((n) => e2bStepOf(spec, n))).toEqual(['base', 'base', '1', '2', 'finalize', 'finalize']);
  });

  it('adds the user account for a registry image, and nothing for a template built here', async () => {
    const fromRegistry = templateBuildRequest(await sdkBody(Template().fromImage('busybox:1', { username: 'u', password: 'p' }).runCmd('true')), { kind: 'oci', reference: 'busybox:1' });
    expect(fromRegistry.credentials).toEqual({ username: 'u', password: 'p' });
    expect(fromRegistry.spec.stages[0].steps.map((s) => s.kind)).toEqual(['run', 'user', 'workdir', 'run']);
    const onTemplate = templateBuildRequest(await sdkBody(Template().fromTemplate('mine').runCmd('true')), { kind: 'image', reference: 'imgx', user: 'app' });
    expect(onTemplate.spec.stages[0].steps.map((s) => s.kind)).toEqual(['run']);
  });

  it('gives a COPY its own upload, the current user as owner unless named, and its mode', () => {
    const hash = 'b'.repeat(64);
    const { spec } = templateBuildRequest(
      {
        fromImage: 'e2bdev/base',
        steps: [
          { type: 'COPY', args: ['app', '/app/', '', ''], force: false, filesHash: hash, gzip: true },
          { type: 'USER', args: ['root'], force: false },
          { type: 'COPY', args: ['f.txt', 'rel/', 'user', '0640'], force: true, filesHash: hash },
        ],
        force: true,
      },
      { kind: 'builtin' },
    );
    const [, , , first, , second] = spec.stages[0].steps;
    expect(first).toMatchObject({ kind: 'copy', sources: ['app'], dest: '/app/', contexts: [`e2b/files/${hash}.tar`], chown: 'user' });
    expect(second).toMatchObject({ kind: 'copy', chown: 'user', chmod: '0640', noCache: true });
    expect(templateBuildRequest({ steps: [], force: true }, { kind: 'builtin' }).noCache).toBe(true);
  });

  it('refuses malformed bodies with a 400 naming the field', () => {
    const cases: [unknown, string][] = [
      [{ steps: [{ type: 'ENV', args: ['A'] }] }, 'steps[0].args'],
      [{ steps: [{ type: 'COPY', args: ['a', '/b'] }] }, 'steps[0].filesHash'],
      [{ steps: [{ type: 'COPY', args: ['a', '/b', '', '9'], filesHash: 'c'.repeat(64) }] }, 'steps[0].args[3]'],
      [{ steps: [{ type: 'RUN', args: [] }] }, 'steps[0].args'],
      [{ steps: [{ type: 'LABEL', args: ['a', 'b'] }] }, 'steps[0].type'],
      [{ steps: 'RUN true' }, 'steps'],
      [{ steps: [], force: 'yes' }, 'force'],
      [{ steps: [], fromImageRegistry: { type: 'registry', username: 'u' } }, 'fromImageRegistry.password'],
    ];
    for (const [body, field] of cases) {
      const err = refusal(() => templateBuildRequest(body as Record<string, unknown>, { kind: 'oci', reference: 'x' }));
      expect(err.code, JSON.stringify(body)).toBe('validation_failed');
      expect(err.details?.field, JSON.stringify(body)).toBe(field);
    }
    expect(refusal(() => templateBuildRequest({ steps: [], fromImageRegistry: { type: 'aws' } }, { kind: 'oci', reference: 'x' })).code).toBe('not_supported');
  });
});

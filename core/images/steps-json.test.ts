import { describe, expect, it } from 'vitest';
import { BuildSpecError } from './build-spec.js';
import { expandWords } from './expand.js';
import { buildStepsSchema, parseBuildSteps } from './steps-json.js';

function refusal(input: unknown): BuildSpecError {
  try {
    parseBuildSteps(input);
  } catch (err) {
    if (err instanceof BuildSpecError) return err;
    throw err;
  }
  throw new Error('expected a BuildSpecError');
}

describe('parseBuildSteps', () => {
  it('maps every step kind onto the build spec', () => {
    const spec = parseBuildSteps({
      steps: [
        { run: 'apt-get update', noCache: true },
        { run: ['echo', 'hi'], user: 'root' },
        { copy: { src: 'app/', dest: '/srv/app', chown: 'app:app', chmod: '0755' } },
        { add: { src: ['a.tgz', 'b.tgz'], dest: '/opt/' } },
        { env: { PATH: '/opt/bin:$PATH', QUOTE: "it's" } },
        { arg: { name: 'V', default: '1' } },
        { arg: { name: 'W' } },
        { workdir: '/srv' },
        { user: 'app' },
        { shell: ['/bin/bash', '-c'] },
        { label: { 'org.example': 'x' } },
        { expose: [8080, '53/udp'] },
        { cmd: 'node server.js' },
        { entrypoint: ['/entry'] },
        { start: { command: 'node server.js', ready: { port: 8080 } } },
      ],
    });
    expect(spec.stages).toHaveLength(1);
    expect(spec.stages[0]!.from).toEqual({ reference: 'default' });
    expect(spec).toMatchObject({ contexts: [], args: {}, ignore: [] });
    const steps = spec.stages[0]!.steps;
    expect(steps.map((s) => s.at.line)).toEqual(steps.map((_, i) => i + 1));
    expect(steps.map(({ at: _at, ...rest }) => rest)).toEqual([
      { kind: 'run', command: { shell: 'apt-get update' }, noCache: true },
      { kind: 'run', command: { argv: ['echo', 'hi'] }, user: 'root' },
      { kind: 'copy', sources: ['app/'], dest: '/srv/app', chown: 'app:app', chmod: '0755' },
      { kind: 'copy', sources: ['a.tgz', 'b.tgz'], dest: '/opt/', extractArchives: true },
      { kind: 'env', vars: [['PATH', '/opt/bin:$PATH'], ['QUOTE', expect.any(String)]] },
      { kind: 'arg', name: 'V', default: '1' },
      { kind: 'arg', name: 'W' },
      { kind: 'workdir', path: '/srv' },
      { kind: 'user', user: 'app' },
      { kind: 'shell', argv: ['/bin/bash', '-c'] },
      { kind: 'label', labels: [['org.example', 'x']] },
      { kind: 'expose', ports: ['8080', '53/udp'] },
      { kind: 'cmd', command: { shell: 'node server.js' } },
      { kind: 'entrypoint', command: { argv: ['/entry'] } },
      { kind: 'start', command: 'node server.js', ready: { kind: 'port', port: 8080 } },
    ]);
    // Values keep $VAR meaning and are otherwise literal through the engine's expansion.
    const env = steps[4] as Extract<(typeof steps)[number], { kind: 'env' }>;
    expect(env.vars.map(([k, v]) => [k, expandWords(v, { PATH: '/bin' })])).toEqual([
      ['PATH', '/opt/bin:/bin'],
      ['QUOTE', "it's"],
    ]);
  });

  it('every ready check', () => {
    const ready = [
      { command: 'curl -f localhost:3000' },
      { port: 3000 },
      { url: 'http://localhost:3000/health', status: 204 },
      { process: 'nginx' },
      { file: '/tmp/ready' },
      { delayMs: 500 },
    ];
    const spec = parseBuildSteps({ from: 'node:20', steps: ready.map((r) => ({ start: { ready: r } })) });
    expect(spec.stages[0]!.steps.map((s) => (s as { ready?: unknown }).ready)).toEqual([
      { kind: 'command', command: 'curl -f localhost:3000' },
      { kind: 'port', port: 3000 },
      { kind: 'url', url: 'http://localhost:3000/health', status: 204 },
      { kind: 'process', name: 'nginx' },
      { kind: 'file', path: '/tmp/ready' },
      { kind: 'delay', ms: 500 },
    ]);
  });

  it('stages come before the final one; from and copy.from name earlier stages', () => {
    const spec = parseBuildSteps({
      stages: [
        { name: 'build', from: 'golang:1.22', steps: [{ run: 'go build -o /out/app' }] },
        { name: 'test', from: 'build', steps: [] },
      ],
      from: 'debian:12',
      steps: [{ copy: { from: 'build', src: '/out/app', dest: '/usr/local/bin/app' } }],
      args: { V: '2' },
      ignore: ['node_modules'],
      contexts: ['contexts/abc'],
    });
    expect(spec.stages.map((s) => [s.index, s.name, s.from])).toEqual([
      [0, 'build', { reference: 'golang:1.22' }],
      [1, 'test', { reference: 'build', stage: 0 }],
      [2, undefined, { reference: 'debian:12' }],
    ]);
    expect(spec.stages[2]!.steps[0]).toMatchObject({ kind: 'copy', fromStage: 0 });
    expect(spec).toMatchObject({ args: { V: '2' }, ignore: ['node_modules'], contexts: ['contexts/abc'] });
  });

  it.each([
    [{ steps: [{ run: 'a' }, { run: 'b' }, { run: 'c' }, { copy: { src: 'a' } }] }, 'steps[3].copy.dest', 4],
    [{ steps: [{ copy: { src: 'a', dest: '/b', mode: 1 } }] }, 'steps[0].copy', 1],
    [{ steps: [{}] }, 'steps[0]', 1],
    [{ steps: [{ run: 'a', copy: { src: 'a', dest: '/b' } }] }, 'steps[0]', 1],
    [{ steps: [{ workdir: '/a', user: 'x' }] }, 'steps[0]', 1],
    [{ steps: [{ frobnicate: true }] }, 'steps[0]', 1],
    [{ steps: [{ run: '' }] }, 'steps[0].run', 1],
    [{ steps: [{ run: [] }] }, 'steps[0].run', 1],
    [{ steps: [{ run: 'x', noCache: 'yes' }] }, 'steps[0].noCache', 1],
    [{ steps: [{ copy: { src: 'a', dest: '/b', chmod: 'rwx' } }] }, 'steps[0].copy.chmod', 1],
    [{ steps: [{ copy: { src: ['a', 'b'], dest: '/b' } }] }, 'steps[0].copy.dest', 1],
    [{ steps: [{ copy: { src: 'a', dest: '/b', from: 'nope' } }] }, 'steps[0].copy.from', 1],
    [{ steps: [{ add: { src: ['ok', 'https://example.com/x.tgz'], dest: '/x/' } }] }, 'steps[0].add.src[1]', 1],
    [{ steps: [{ env: { 'A=B': 'x' } }] }, 'steps[0].env["A=B"]', 1],
    [{ steps: [{ env: { A: 1 } }] }, 'steps[0].env.A', 1],
    [{ steps: [{ env: { A: '${unterminated' } }] }, 'steps[0].env.A', 1],
    [{ steps: [{ arg: { name: '1x' } }] }, 'steps[0].arg.name', 1],
    [{ steps: [{ expose: [0] }] }, 'steps[0].expose[0]', 1],
    [{ steps: [{ expose: ['http'] }] }, 'steps[0].expose[0]', 1],
    [{ steps: [{ shell: [] }] }, 'steps[0].shell', 1],
    [{ steps: [{ start: {} }] }, 'steps[0].start', 1],
    [{ steps: [{ start: { ready: { port: 1, file: '/x' } } }] }, 'steps[0].start.ready', 1],
    [{ steps: [{ start: { ready: { url: 'not a url' } } }] }, 'steps[0].start.ready.url', 1],
    [{ steps: [{ run: 'x'.repeat(64 * 1024 + 1) }] }, 'steps[0].run', 1],
    [{ stages: [{ name: 'a', from: 'x', steps: [{ run: 'ok' }, { run: 1 }] }], steps: [] }, 'stages[0].steps[1].run', 2],
    [{ stages: [{ name: 'a', from: 'b', steps: [] }, { name: 'b', from: 'x', steps: [] }], steps: [] }, 'stages[0].from', undefined],
    [{ stages: [{ name: 'a', from: 'x', steps: [] }, { name: 'a', from: 'x', steps: [] }], steps: [] }, 'stages[1].name', undefined],
    [{ stages: [{ name: 'Upper', from: 'x', steps: [] }], steps: [] }, 'stages[0].name', undefined],
    [{ steps: [], args: { 'bad name': 'x' } }, 'args["bad name"]', undefined],
    [{ steps: [], extra: 1 }, 'body', undefined],
    [{ from: 'x' }, 'steps', undefined],
    ['not an object', 'body', undefined],
  ])('%j → %s', (input, field, line) => {
    const err = refusal(input);
    expect(err.field).toBe(field);
    expect(err.line).toBe(line);
  });

  it('bounds the number of steps', () => {
    expect(parseBuildSteps({ steps: Array.from({ length: 1000 }, () => ({ run: 'true' })) }).stages[0]!.steps).toHaveLength(1000);
    expect(refusal({ steps: Array.from({ length: 1001 }, () => ({ run: 'true' })) }).field).toBe('steps');
    const half = Array.from({ length: 600 }, () => ({ run: 'true' }));
    expect(refusal({ stages: [{ from: 'x', steps: half }], steps: half }).message).toMatch(/more than 1000 steps/);
  });

  it('says what was wrong', () => {
    expect(refusal({ steps: [{ run: 'a', workdir: '/x' }] }).message).toMatch(/exactly one instruction; found run and workdir/);
    expect(refusal({ steps: [{}] }).message).toMatch(/needs exactly one of run, copy/);
    expect(refusal({ steps: [{ copy: { src: 'a' } }] }).message).toMatch(/^line 1: /);
  });

  it('exports the schema (for the OpenAPI description)', () => {
    expect(buildStepsSchema.safeParse({ steps: [{ run: 'x' }] }).success).toBe(true);
  });
});

import { describe, expect, it } from 'vitest';
import { BuildSpecError, type BuildStep } from './build-spec.js';
import { expandWords, parseDockerfile, PLATFORM_ARGS } from './dockerfile.js';

/** The steps of the last stage, without their positions. */
function steps(text: string): Omit<BuildStep, 'at'>[] {
  const spec = parseDockerfile(text);
  return spec.stages[spec.stages.length - 1]!.steps.map(({ at: _at, ...rest }) => rest);
}

function refusal(text: string, options?: Parameters<typeof parseDockerfile>[1]): BuildSpecError {
  try {
    parseDockerfile(text, options);
  } catch (err) {
    if (err instanceof BuildSpecError) return err;
    throw err;
  }
  throw new Error('expected a BuildSpecError');
}

describe('parseDockerfile: instructions', () => {
  it('maps each instruction onto its step', () => {
    const spec = parseDockerfile(
      [
        'FROM debian:12',
        'RUN apt-get update',
        'RUN ["echo", "a b"]',
        'COPY a.txt /app/',
        'ADD pkg.tar.gz /opt/',
        'ENV A=1 B="two words"',
        'ARG V=3',
        'ARG W',
        'WORKDIR /app',
        'USER nobody:nogroup',
        'SHELL ["/bin/bash", "-o", "pipefail", "-c"]',
        'LABEL org.x=y "k 2"=v',
        'EXPOSE 80 443/tcp 53/udp',
        'VOLUME ["/data", "/logs"]',
        'VOLUME /cache',
        'STOPSIGNAL SIGINT',
        'CMD ["node", "server.js"]',
        'ENTRYPOINT exec /entry.sh',
        'MAINTAINER Jane "J" Doe',
      ].join('\n'),
    );
    expect(spec.stages).toHaveLength(1);
    const s = spec.stages[0]!;
    expect(s.from).toEqual({ reference: 'debian:12' });
    expect(s.at).toEqual({ line: 1, text: 'FROM debian:12' });
    expect(s.steps.map(({ at: _at, ...rest }) => rest)).toEqual([
      { kind: 'run', command: { shell: 'apt-get update' } },
      { kind: 'run', command: { argv: ['echo', 'a b'] } },
      { kind: 'copy', sources: ['a.txt'], dest: '/app/' },
      { kind: 'copy', sources: ['pkg.tar.gz'], dest: '/opt/', extractArchives: true },
      { kind: 'env', vars: [['A', '1'], ['B', '"two words"']] },
      { kind: 'arg', name: 'V', default: '3' },
      { kind: 'arg', name: 'W' },
      { kind: 'workdir', path: '/app' },
      { kind: 'user', user: 'nobody:nogroup' },
      { kind: 'shell', argv: ['/bin/bash', '-o', 'pipefail', '-c'] },
      { kind: 'label', labels: [['org.x', 'y'], ['k 2', 'v']] },
      { kind: 'expose', ports: ['80', '443/tcp', '53/udp'] },
      { kind: 'volume', paths: ['/data', '/logs'] },
      { kind: 'volume', paths: ['/cache'] },
      { kind: 'stopsignal', signal: 'SIGINT' },
      { kind: 'cmd', command: { argv: ['node', 'server.js'] } },
      { kind: 'entrypoint', command: { shell: 'exec /entry.sh' } },
      { kind: 'label', labels: [['maintainer', expect.any(String)]] },
    ]);
    // The MAINTAINER text is kept literally through the engine's expansion.
    const maintainer = s.steps[17] as Extract<BuildStep, { kind: 'label' }>;
    expect(expandWords(maintainer.labels[0]![1], {})).toBe('Jane "J" Doe');
    // Positions name the line and the instruction.
    expect(s.steps.map((x) => x.at.line)).toEqual([2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]);
    expect(s.steps[0]!.at.text).toBe('RUN apt-get update');
    expect(spec).toMatchObject({ contexts: [], ignore: [] });
  });

  it('keeps ENV values as Docker words the engine expands (quotes, escapes, $VAR, legacy form)', () => {
    const [env1, env2, env3] = steps('FROM x\nENV a=b c="d e" f=g\\ h i=\'$lit\' j=$HOME\nENV legacy  two words\nENV PATH=/opt/bin:$PATH') as Extract<BuildStep, { kind: 'env' }>[];
    const expanded = env1!.vars.map(([k, v]) => [k, expandWords(v, { HOME: '/root' })]);
    expect(expanded).toEqual([['a', 'b'], ['c', 'd e'], ['f', 'g h'], ['i', '$lit'], ['j', '/root']]);
    expect(env2!.vars).toEqual([['legacy', 'two words']]);
    expect(expandWords(env3!.vars[0]![1], { PATH: '/usr/bin' })).toBe('/opt/bin:/usr/bin');
  });

  it('shell form vs exec form; an invalid JSON array is the shell form, as in Docker', () => {
    expect(steps('FROM x\nRUN [ "a" , "b" ]\nCMD ["a", \'b\']\nENTRYPOINT []\nRUN [not json')).toEqual([
      { kind: 'run', command: { argv: ['a', 'b'] } },
      { kind: 'cmd', command: { shell: '["a", \'b\']' } },
      { kind: 'entrypoint', command: { argv: [] } },
      { kind: 'run', command: { shell: '[not json' } },
    ]);
  });

  it('joins continuation lines, drops comment lines inside them, and numbers lines from the start', () => {
    const spec = parseDockerfile('# a comment\n\nFROM x\nRUN echo a \\\n# inner comment\n  b \\\n  c\nRUN ["echo", \\\n  "d"]\nUSER me');
    const [run1, run2, user] = spec.stages[0]!.steps;
    expect(run1).toMatchObject({ kind: 'run', command: { shell: 'echo a   b   c' }, at: { line: 4 } });
    expect(run2).toMatchObject({ kind: 'run', command: { argv: ['echo', 'd'] }, at: { line: 8 } });
    expect(user).toMatchObject({ at: { line: 10 } });
    expect(spec.stages[0]!.at.line).toBe(3);
  });

  it('honours the escape directive (backtick continuation, backslash literal)', () => {
    const spec = parseDockerfile('# escape=`\nFROM x\nRUN echo a `\n  b\nWORKDIR C:\\app\nENV Q=`$lit P="`"q"');
    const [run, workdir, env] = spec.stages[0]!.steps as [BuildStep, Extract<BuildStep, { kind: 'workdir' }>, Extract<BuildStep, { kind: 'env' }>];
    expect(run).toMatchObject({ command: { shell: 'echo a   b' } });
    // Words reach the engine in backslash syntax with the same meaning.
    expect(expandWords(workdir.path, {})).toBe('C:\\app');
    expect(env.vars.map(([k, v]) => [k, expandWords(v, { lit: 'no' })])).toEqual([['Q', '$lit'], ['P', '"q']]);
  });

  it('with the backtick escape a trailing backslash is not a continuation', () => {
    // Line 4 is then its own (unknown) instruction.
    expect(refusal('# escape=`\nFROM x\nRUN echo a \\\nnope').line).toBe(4);
  });

  it('COPY/ADD flags and JSON form', () => {
    const spec = parseDockerfile(
      'FROM a AS build\nFROM b\nCOPY --from=build --chown=app:app --chmod=0644 --link /out/bin /usr/local/bin/\nCOPY --from=0 /x /y\nCOPY --from=alpine:3 /etc/os-release /\nCOPY ["with space", "$V", "/dst/"]\nADD --chmod=755 --link=false a b /c/',
    );
    expect(spec.stages[1]!.steps.map(({ at: _at, ...rest }) => rest)).toEqual([
      { kind: 'copy', sources: ['/out/bin'], dest: '/usr/local/bin/', fromStage: 0, chown: 'app:app', chmod: '0644' },
      { kind: 'copy', sources: ['/x'], dest: '/y', fromStage: 0 },
      { kind: 'copy', sources: ['/etc/os-release'], dest: '/', fromImage: 'alpine:3' },
      { kind: 'copy', sources: ['with space', '$V'], dest: '/dst/' },
      { kind: 'copy', sources: ['a', 'b'], dest: '/c/', chmod: '755', extractArchives: true },
    ]);
    const json = spec.stages[1]!.steps[3] as Extract<BuildStep, { kind: 'copy' }>;
    expect(json.sources.map((s) => expandWords(s, { V: 'v' }))).toEqual(['with space', 'v']);
  });

  it('multi-stage: names lower-cased, FROM of an earlier stage sets from.stage', () => {
    const spec = parseDockerfile('FROM golang AS Build\nRUN go build\nFROM build AS test\nFROM scratch\nCOPY --from=BUILD /a /a\nCOPY --from=Test /b /b');
    expect(spec.stages.map((s) => [s.index, s.name, s.from])).toEqual([
      [0, 'build', { reference: 'golang' }],
      [1, 'test', { reference: 'build', stage: 0 }],
      [2, undefined, { reference: 'scratch' }],
    ]);
    expect(spec.stages[2]!.steps.map((s) => (s as Extract<BuildStep, { kind: 'copy' }>).fromStage)).toEqual([0, 1]);
  });

  it('global ARGs are usable in FROM (build args override); a stage ARG without a value inherits the global default', () => {
    const text = 'ARG BASE=debian\nARG TAG=${BASE}-12\nFROM ${BASE}:${TAG}\nARG TAG\nARG TARGETARCH\nARG BASE=own\nARG NOGLOBAL\nFROM --platform=$BUILDPLATFORM $BASE AS two';
    const spec = parseDockerfile(text);
    expect(spec.stages[0]!.from.reference).toBe('debian:debian-12');
    expect(spec.stages[0]!.steps.map(({ at: _at, ...rest }) => rest)).toEqual([
      { kind: 'arg', name: 'TAG', default: 'debian-12' },
      { kind: 'arg', name: 'TARGETARCH', default: PLATFORM_ARGS.TARGETARCH },
      { kind: 'arg', name: 'BASE', default: 'own' },
      { kind: 'arg', name: 'NOGLOBAL' },
    ]);
    expect(spec.stages[1]!.from).toEqual({ reference: 'debian', platform: 'linux/amd64' });
    // Only build args: a stage's own ARG default must not lose to a global one.
    expect(spec.args).toEqual({});

    const overridden = parseDockerfile(text, { args: { BASE: 'ubuntu', EXTRA: '1' }, contexts: ['ctx/1'], ignore: ['*.log'] });
    expect(overridden.stages[0]!.from.reference).toBe('ubuntu:ubuntu-12');
    expect(overridden.stages[0]!.steps[0]).toMatchObject({ default: 'ubuntu-12' });
    expect(overridden.args).toEqual({ BASE: 'ubuntu', EXTRA: '1' });
    expect(overridden.contexts).toEqual(['ctx/1']);
    expect(overridden.ignore).toEqual(['*.log']);
  });

  it('a global ARG can name the stage a FROM starts from', () => {
    const spec = parseDockerfile('ARG FROMSTAGE=base\nFROM alpine AS base\nFROM $FROMSTAGE');
    expect(spec.stages[1]!.from).toEqual({ reference: 'base', stage: 0 });
  });

  it('accepts HEALTHCHECK NONE, the standard syntax directive and an empty ARG default', () => {
    expect(steps('# syntax=docker/dockerfile:1.7\nFROM x\nHEALTHCHECK NONE\nARG E=')).toEqual([{ kind: 'arg', name: 'E', default: '' }]);
  });

  it('lower-case keywords are instructions too', () => {
    expect(steps('from x\nrun true\nexpose 8080')).toEqual([
      { kind: 'run', command: { shell: 'true' } },
      { kind: 'expose', ports: ['8080'] },
    ]);
  });
});

describe('parseDockerfile: refusals name the line', () => {
  it.each([
    ['FROM x\nONBUILD RUN make', 2, /ONBUILD/],
    ['FROM x\n\nRUN --mount=type=cache,target=/root/.cache pip install x', 3, /--mount/],
    ['FROM x\nRUN --network=none true', 2, /--network/],
    ['FROM x\nRUN --security=insecure true', 2, /--security/],
    ['FROM x\nRUN --frobnicate true', 2, /unknown flag for RUN: --frobnicate/],
    ['FROM x\nRUN <<EOF\necho hi\nEOF', 2, /heredoc/],
    ['FROM x\nCOPY <<EOF /f\nhi\nEOF', 2, /heredoc/],
    ['FROM x\nCOPY --parents a/b /c/', 2, /--parents/],
    ['FROM x\nCOPY --exclude=*.md . /c/', 2, /--exclude/],
    ['FROM x\nCOPY --from a /b', 2, /--from needs a value/],
    ['FROM x\nCOPY --chmod=u+x a /b', 2, /octal/],
    ['FROM x\nCOPY --link=maybe a /b', 2, /--link/],
    ['FROM x\nCOPY a b /c', 2, /ending with \//],
    ['FROM x\nCOPY onlyone', 2, /source and a destination/],
    ['FROM x\nADD https://example.com/a.tgz /a', 2, /RUN curl/],
    ['FROM x\nADD http://example.com/a /a', 2, /RUN curl/],
    ['FROM x\nADD git@github.com:o/r.git /src', 2, /RUN curl|git clone/],
    ['FROM x\nADD --checksum=sha256:00 a /b', 2, /--checksum/],
    ['FROM x\nADD --keep-git-dir=true a /b', 2, /--keep-git-dir/],
    ['FROM x\nADD --from=y a /b', 2, /unknown flag for ADD: --from/],
    ['FROM x\nFOO bar', 2, /unknown instruction FOO/],
    ['FROM x\nHEALTHCHECK CMD curl -f http://localhost/', 2, /HEALTHCHECK/],
    ['FROM x\nHEALTHCHECK --interval=5s NONE', 2, /HEALTHCHECK/],
    ['RUN true\nFROM x', 1, /before the first FROM/],
    ['ARG A\n# c\nENV B=1\nFROM x', 3, /ENV before the first FROM/],
    ['ARG A=1', 1, /no FROM/],
    ['FROM later\nFROM x AS later', 1, /not defined before/],
    ['FROM x AS a\nFROM a AS a', 2, /duplicate stage name/],
    ['FROM x AS self\nCOPY --from=self /a /b', 2, /not defined before this stage/],
    ['FROM x\nCOPY --from=1 /a /b\nFROM y AS one', 2, /stage 1 is not defined before/],
    ['FROM x\nCOPY --from=ONE /a /b\nFROM y AS one', 2, /"one" is not defined before/],
    ['FROM x AS 1bad', 1, /invalid stage name/],
    ['FROM x AS', 1, /FROM <image> \[AS <name>\]/],
    ['FROM x y', 1, /FROM <image>/],
    ['FROM --platform=linux/arm64 x', 1, /linux\/amd64/],
    ['FROM --platform linux/amd64 x', 1, /--platform needs a value/],
    ['ARG P=windows/amd64\nFROM --platform=$P x', 2, /windows\/amd64/],
    ['FROM $NOTHING', 1, /image reference is empty/],
    ['FROM x\nENV', 2, /ENV needs/],
    ['FROM x\nENV a=1 b', 2, /ENV b: missing value/],
    ['FROM x\nENV onlyname', 2, /missing value/],
    ['FROM x\nLABEL k', 2, /LABEL k: missing value/],
    ['FROM x\nENV a="unterminated', 2, /double-quote/],
    ['FROM x\nWORKDIR \'/open', 2, /single-quote/],
    ['FROM x\nWORKDIR', 2, /WORKDIR needs a value/],
    ['FROM x\nWORKDIR --foo /a', 2, /unknown flag for WORKDIR: --foo/],
    ['FROM x\nUSER', 2, /USER needs a value/],
    ['FROM x\nEXPOSE http', 2, /EXPOSE http/],
    ['FROM x\nEXPOSE', 2, /EXPOSE needs/],
    ['FROM x\nSHELL /bin/bash -c', 2, /SHELL needs the JSON form/],
    ['FROM x\nSHELL []', 2, /SHELL needs the JSON form/],
    ['FROM x\nRUN', 2, /RUN needs a command/],
    ['FROM x\nARG 1abc=2', 2, /invalid ARG name/],
    ['# syntax=example.com/custom-frontend\nFROM x', 1, /standard Dockerfile syntax/],
    ['# escape=x\nFROM x', 1, /escape directive/],
    ['FROM x\nRUN ${bad', undefined, undefined], // RUN is not a word: the shell gets it as written
  ])('%j → line %s', (text, line, message) => {
    if (line === undefined) {
      expect(() => parseDockerfile(text)).not.toThrow();
      return;
    }
    const err = refusal(text);
    expect(err.field).toBe('dockerfile');
    expect(err.line).toBe(line);
    expect(err.message).toMatch(message!);
    expect(err.message.startsWith(`line ${line}: `)).toBe(true);
  });

  it('refuses an empty file, a file over 1 MiB and more than 1000 instructions', () => {
    expect(refusal('').message).toMatch(/empty/);
    expect(refusal('# only a comment\n\n').message).toMatch(/empty/);
    expect(refusal(`FROM x\n# ${'a'.repeat(1024 * 1024)}`).message).toMatch(/larger than 1048576 bytes/);
    const many = ['FROM x', ...Array.from({ length: 1000 }, (_, i) => `ENV A${i}=1`)].join('\n');
    expect(refusal(many)).toMatchObject({ line: 1001 });
    expect(refusal(many).message).toMatch(/more than 1000 instructions/);
    expect(parseDockerfile(['FROM x', ...Array.from({ length: 999 }, () => 'RUN true')].join('\n')).stages[0]!.steps).toHaveLength(999);
  });

  it('refuses a build argument with an invalid name, naming args', () => {
    expect(refusal('FROM x', { args: { 'not valid': '1' } })).toMatchObject({ field: 'args' });
  });
});

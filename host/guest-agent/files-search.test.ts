import { chmod, mkdir, readFile, readdir, stat, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../agent-protocol/client.js';
import { FindResponse, ReplaceResponse, SearchResponse } from '../agent-protocol/files.js';
import { compileGlob, globToRegExp } from './files-glob.js';
import { call, q } from './files-testing.js';
import { startTestAgent, type TestAgent } from './testing.js';


describe('globs', () => {
  it.each([
    ['*.ts', 'main.ts', true],
    ['*.ts', 'main.tsx', false],
    ['*.ts', 'dir/main.ts', false],
    ['test_*', 'test_one.py', true],
    ['?.txt', 'a.txt', true],
    ['?.txt', 'ab.txt', false],
    ['[ab].txt', 'b.txt', true],
    ['[!ab].txt', 'b.txt', false],
    ['[!ab].txt', 'c.txt', true],
    ['[a-c]x', 'bx', true],
    ['*.{ts,js}', 'a.js', true],
    ['*.{ts,js}', 'a.py', false],
    ['{a,b{c,d}}', 'bd', true],
    ['src/**/*.ts', 'src/main.ts', true],
    ['src/**/*.ts', 'src/lib/deep/util.ts', true],
    ['src/**/*.ts', 'other/src/main.ts', false],
    ['**/*.md', 'readme.md', true],
    ['**', 'any/thing/at/all', true],
    ['a+b(c).txt', 'a+b(c).txt', true],
    ['\\*.txt', '*.txt', true],
    ['\\*.txt', 'a.txt', false],
    ['unbalanced{.txt', 'unbalanced{.txt', true],
    ['[unterminated', '[unterminated', true],
  ])('%s matches %s: %s', (pattern, candidate, expected) => {
    expect(globToRegExp(pattern).test(candidate)).toBe(expected);
  });

  it('matches names for slash-free patterns and relative paths otherwise', () => {
    expect(compileGlob('*.ts', 'pattern').test('util.ts', 'src/lib/util.ts')).toBe(true);
    expect(compileGlob('src/*.ts', 'pattern').test('util.ts', 'src/lib/util.ts')).toBe(false);
    expect(compileGlob('./src/**/*.ts', 'pattern').test('util.ts', 'src/lib/util.ts')).toBe(true);
    expect(() => compileGlob('', 'pattern')).toThrow(/^pattern: required/);
  });
});

describe('find, search and replace routes', () => {
  let agent: TestAgent;
  let client: AgentClient;
  let proj: string;

  beforeAll(async () => {
    agent = await startTestAgent();
    client = new AgentClient(agent.socketPath);
    proj = join(agent.home, 'proj');
    await mkdir(join(proj, 'src/lib/deep'), { recursive: true });
    await mkdir(join(proj, 'docs'), { recursive: true });
    await writeFile(join(proj, 'src/main.ts'), 'import x from "y";\nconst a = 1; // TODO: fix\n\tlet TODO = 2;\n');
    await writeFile(join(proj, 'src/lib/util.ts'), 'export const todo = "later";\r\nno match here\r\n');
    await writeFile(join(proj, 'src/lib/deep/more.ts'), 'nothing\n');
    await writeFile(join(proj, 'src/test_main.py'), 'def test_todo(): pass  # TODO\n');
    await writeFile(join(proj, 'docs/readme.md'), '# Title\n\nSome TODO in docs');
    await writeFile(join(proj, 'src/blob.bin'), Buffer.concat([Buffer.from('binary\0'), Buffer.from('TODO inside binary\n')]));
    await writeFile(join(proj, 'src/long.txt'), `${'x'.repeat(5000)}TODO${'y'.repeat(100)}\n`);
    await symlink(join(agent.home, 'outside'), join(proj, 'link-out'));
    await mkdir(join(agent.home, 'outside'), { recursive: true });
    await writeFile(join(agent.home, 'outside/secret.ts'), 'TODO secret\n');
  });
  afterAll(async () => {
    client.close();
    await agent.stop();
  });

  const rel = (paths: string[]) => paths.map((path) => path.slice(proj.length + 1));

  describe('GET /files/find', () => {
    const find = async (params: Record<string, string | number>) => {
      const response = await call(client, 'GET', `/files/find?${q({ path: 'proj', ...params })}`);
      expect(response.status, response.raw.toString()).toBe(200);
      return FindResponse.parse(response.json());
    };

    it('matches names with a slash-free glob, anywhere in the tree, never through a symlink', async () => {
      const found = await find({ pattern: '*.ts' });
      expect(rel(found.paths)).toEqual(['src/lib/deep/more.ts', 'src/lib/util.ts', 'src/main.ts']);
      expect(found).toMatchObject({ truncated: false, unreadableDirs: 0 });
      expect(rel((await find({ pattern: 'test_*' })).paths)).toEqual(['src/test_main.py']);
      // Directories match too.
      expect(rel((await find({ pattern: 'lib' })).paths)).toEqual(['src/lib']);
    });

    it('matches relative paths when the pattern has a slash', async () => {
      expect(rel((await find({ pattern: 'src/**/*.ts' })).paths)).toEqual(['src/lib/deep/more.ts', 'src/lib/util.ts', 'src/main.ts']);
      expect(rel((await find({ pattern: 'src/*.ts' })).paths)).toEqual(['src/main.ts']);
      expect(rel((await find({ pattern: 'docs/*' })).paths)).toEqual(['docs/readme.md']);
    });

    it('truncates at maxResults and says so', async () => {
      const found = await find({ pattern: '*', maxResults: 2 });
      expect(found.paths).toHaveLength(2);
      expect(found.truncated).toBe(true);
      const exact = await find({ pattern: '*.ts', maxResults: 3 });
      expect(exact).toMatchObject({ truncated: false });
      expect(exact.paths).toHaveLength(3);
    });

    // Unreadable directories are counted in agent-protocol/client.test.ts, with an agent run as nobody.

    it('validates its parameters', async () => {
      const noPattern = await call(client, 'GET', `/files/find?${q({ path: 'proj' })}`);
      expect(noPattern.status).toBe(400);
      expect(noPattern.json().error.message).toBe('pattern: required');
      expect((await call(client, 'GET', `/files/find?${q({ path: 'proj', pattern: '*', maxResults: 0 })}`)).json().error.message).toMatch(/^maxResults: /);
      expect((await call(client, 'GET', `/files/find?${q({ path: 'proj/src/main.ts', pattern: '*' })}`)).json().error.message).toMatch(/^path: not a directory/);
      expect((await call(client, 'GET', `/files/find?${q({ path: 'nope', pattern: '*' })}`)).status).toBe(404);
    });
  });

  describe('GET /files/search', () => {
    const search = async (params: Record<string, string | number | boolean>) => {
      const response = await call(client, 'GET', `/files/search?${q({ path: 'proj', ...params })}`);
      expect(response.status, response.raw.toString()).toBe(200);
      return SearchResponse.parse(response.json());
    };
    const summary = (found: SearchResponse) => found.matches.map((match) => `${match.path.slice(proj.length + 1)}:${match.line}:${match.column}`);

    it('finds a literal, case-sensitively by default, with 1-based line and column, skipping binaries', async () => {
      const found = await search({ query: 'TODO' });
      expect(summary(found)).toEqual(['docs/readme.md:3:6', 'src/long.txt:1:5001', 'src/main.ts:2:17', 'src/main.ts:3:6', 'src/test_main.py:1:26']);
      expect(found.binaryFilesSkipped).toBe(1);
      expect(found.truncated).toBe(false);
      const line = found.matches.find((match) => match.path.endsWith('main.ts') && match.line === 3)!;
      expect(line.text).toBe('\tlet TODO = 2;');
      // The line is capped at 1000 characters.
      expect(found.matches.find((match) => match.path.endsWith('long.txt'))!.text).toBe('x'.repeat(1000));
    });

    it('matches case-insensitively and filters by glob', async () => {
      const found = await search({ query: 'todo', caseSensitive: false, glob: '*.ts' });
      expect(summary(found)).toEqual(['src/lib/util.ts:1:14', 'src/main.ts:2:17', 'src/main.ts:3:6']);
      // CRLF line endings are not part of the line.
      expect(found.matches[0].text).toBe('export const todo = "later";');
      const byPath = await search({ query: 'TODO', glob: 'src/*.py' });
      expect(summary(byPath)).toEqual(['src/test_main.py:1:26']);
    });

    it('takes a regex, reporting where the match starts', async () => {
      const found = await search({ query: 'const [a-z]+ =', regex: true });
      expect(summary(found)).toEqual(['src/lib/util.ts:1:8', 'src/main.ts:2:1']);
      const literal = await search({ query: 'const [a-z]+ =' });
      expect(found.matches.length).toBeGreaterThan(0);
      expect(literal.matches).toEqual([]);
      const bad = await call(client, 'GET', `/files/search?${q({ path: 'proj', query: '([', regex: true })}`);
      expect(bad.status).toBe(400);
      expect(bad.json().error.message).toMatch(/^query: invalid regular expression/);
    });

    it('searches a single file, truncates at maxResults and requires a query', async () => {
      expect(summary(await search({ path: 'proj/src/main.ts', query: 'TODO' }))).toEqual(['src/main.ts:2:17', 'src/main.ts:3:6']);
      const limited = await search({ query: 'TODO', maxResults: 2 });
      expect(limited.matches).toHaveLength(2);
      expect(limited.truncated).toBe(true);
      expect((await call(client, 'GET', `/files/search?${q({ path: 'proj' })}`)).json().error.message).toBe('query: required');
    });

    it('streams a large file line by line and finds a match at its end', async () => {
      const big = join(proj, 'big.log');
      const line = `${'filler '.repeat(20)}\n`;
      await writeFile(big, line.repeat(200_000) + 'NEEDLE at the end\n');
      const found = await search({ path: 'proj/big.log', query: 'NEEDLE' });
      expect(found.matches).toEqual([{ path: big, line: 200_001, column: 1, text: 'NEEDLE at the end' }]);
    });
  });

  describe('POST /files/replace', () => {
    it('replaces in each file atomically, keeping the mode, reporting counts and per-file errors', async () => {
      const dir = join(agent.home, 'rep');
      await mkdir(dir, { recursive: true });
      await writeFile(join(dir, 'a.txt'), 'foo bar foo\nfoo\n');
      await chmod(join(dir, 'a.txt'), 0o640);
      await writeFile(join(dir, 'b.txt'), 'nothing to see\n');
      const inodeBefore = (await stat(join(dir, 'a.txt'))).ino;
      const bMtime = (await stat(join(dir, 'b.txt'))).mtimeMs;
      const response = await call(client, 'POST', '/files/replace', { paths: ['rep/a.txt', 'rep/b.txt', 'rep/missing.txt', 'rep'], find: 'foo', replace: '$&-baz' });
      expect(response.status).toBe(200);
      const { results } = ReplaceResponse.parse(response.json());
      expect(results.map((result) => [result.path.slice(dir.length + 1), result.replacements, result.error?.code])).toEqual([
        ['a.txt', 3, undefined],
        ['b.txt', 0, undefined],
        ['missing.txt', 0, 'not_found'],
        ['', 0, 'validation_failed'],
      ]);
      // Literal: `$&` is not a pattern reference without regex.
      expect(await readFile(join(dir, 'a.txt'), 'utf8')).toBe('$&-baz bar $&-baz\n$&-baz\n');
      const after = await stat(join(dir, 'a.txt'));
      expect(after.mode & 0o777).toBe(0o640);
      // Atomic: a new inode was renamed into place.
      expect(after.ino).not.toBe(inodeBefore);
      // Untouched when nothing matched.
      expect((await stat(join(dir, 'b.txt'))).mtimeMs).toBe(bMtime);
      expect((await readdir(dir)).filter((name) => name.endsWith('.tmp'))).toEqual([]);
    });

    it('replaces with a regex and capture groups, across lines', async () => {
      const path = join(agent.home, 'rep/regex.txt');
      await writeFile(path, 'name: alice\nname: bob\n');
      const response = await call(client, 'POST', '/files/replace', { paths: [path], find: 'name: (\\w+)', replace: 'user=$1', regex: true });
      expect(response.json().results).toEqual([{ path, replacements: 2 }]);
      expect(await readFile(path, 'utf8')).toBe('user=alice\nuser=bob\n');
    });

    it('refuses binary-looking (non UTF-8) files and bad requests', async () => {
      const path = join(agent.home, 'rep/latin1.txt');
      await writeFile(path, Buffer.from([0x66, 0x6f, 0x6f, 0xff, 0xfe]));
      const response = await call(client, 'POST', '/files/replace', { paths: [path], find: 'foo', replace: 'bar' });
      expect(response.json().results[0]).toMatchObject({ replacements: 0, error: { code: 'validation_failed' } });
      expect(await readFile(path)).toEqual(Buffer.from([0x66, 0x6f, 0x6f, 0xff, 0xfe]));
      const badRegex = await call(client, 'POST', '/files/replace', { paths: [path], find: '(', replace: '', regex: true });
      expect(badRegex.status).toBe(400);
      expect(badRegex.json().error.message).toMatch(/^find: /);
      const nul = await call(client, 'POST', '/files/replace', { paths: ['ok', 'a\0b'], find: 'x', replace: 'y' });
      expect(nul.status).toBe(400);
      expect(nul.json().error.message).toMatch(/^paths\[1\]: .*NUL/);
      const empty = await call(client, 'POST', '/files/replace', { paths: [], find: 'x', replace: 'y' });
      expect(empty.status).toBe(400);
      expect(empty.json().error.message).toMatch(/^paths: /);
    });

    it('reports files above the size limit as payload_too_large', async () => {
      const small = await startTestAgent({ maxReplaceFileBytes: 10 });
      const smallClient = new AgentClient(small.socketPath);
      try {
        await writeFile(join(small.home, 'big.txt'), 'x'.repeat(11));
        const response = await call(smallClient, 'POST', '/files/replace', { paths: ['big.txt'], find: 'x', replace: 'y' });
        expect(response.json().results[0].error.code).toBe('payload_too_large');
      } finally {
        smallClient.close();
        await small.stop();
      }
    });
  });
});

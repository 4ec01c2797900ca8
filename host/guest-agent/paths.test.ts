import { describe, expect, it } from 'vitest';
import { AgentHttpError } from './errors.js';
import { baseName, parseFileMode, resolveOptionalSandboxPath, resolveSandboxPath } from './paths.js';
import { parseRangeHeader } from './range.js';

function failure(action: () => unknown): AgentHttpError {
  try {
    action();
  } catch (error) {
    if (error instanceof AgentHttpError) return error;
    throw error;
  }
  throw new Error('expected an AgentHttpError');
}

describe('resolveSandboxPath', () => {
  it('resolves relative paths against home, never the process cwd', () => {
    expect(resolveSandboxPath('notes/a.txt', '/home/user')).toBe('/home/user/notes/a.txt');
    expect(resolveSandboxPath('../other', '/home/user')).toBe('/home/other');
  });

  it('normalises absolute paths', () => {
    expect(resolveSandboxPath('/etc/../var//log/', '/root')).toBe('/var/log');
  });

  it('rejects a missing path naming the field', () => {
    const error = failure(() => resolveSandboxPath(null, '/root'));
    expect(error.status).toBe(400);
    expect(error.code).toBe('validation_failed');
    expect(error.message).toMatch(/^path: required/);
    expect(failure(() => resolveSandboxPath('', '/root')).message).toMatch(/^path:/);
  });

  it('rejects NUL bytes naming the field', () => {
    expect(failure(() => resolveSandboxPath('a\0b', '/root')).message).toMatch(/^path: .*NUL/);
    expect(failure(() => resolveSandboxPath('a\0b', '/root', 'cwd')).message).toMatch(/^cwd: /);
  });

  it('defaults an optional path to home', () => {
    expect(resolveOptionalSandboxPath(undefined, '/home/u')).toBe('/home/u');
    expect(resolveOptionalSandboxPath('x', '/home/u')).toBe('/home/u/x');
  });

  it('names the root "/"', () => {
    expect(baseName('/')).toBe('/');
    expect(baseName('/a/b.txt')).toBe('b.txt');
  });
});

describe('parseFileMode', () => {
  it('accepts three- and four-digit octal strings', () => {
    expect(parseFileMode('644')).toBe(0o644);
    expect(parseFileMode('0755')).toBe(0o755);
    expect(parseFileMode('4755')).toBe(0o4755);
    expect(parseFileMode(null)).toBeUndefined();
  });

  it.each(['888', '75', 'rw-r--r--', '0o644', '12345'])('rejects %s naming mode', (raw) => {
    const error = failure(() => parseFileMode(raw));
    expect(error.status).toBe(400);
    expect(error.message).toMatch(/^mode: /);
  });
});

describe('parseRangeHeader', () => {
  it('answers the whole file without a header or with one it cannot use', () => {
    expect(parseRangeHeader(undefined, 10)).toEqual({ kind: 'full' });
    expect(parseRangeHeader('bytes=0-1,4-5', 10)).toEqual({ kind: 'full' });
    expect(parseRangeHeader('items=0-1', 10)).toEqual({ kind: 'full' });
    expect(parseRangeHeader('bytes=5-2', 10)).toEqual({ kind: 'full' });
    expect(parseRangeHeader('bytes=-', 10)).toEqual({ kind: 'full' });
  });

  it('parses closed, open-ended and suffix ranges, clamping to the size', () => {
    expect(parseRangeHeader('bytes=2-5', 10)).toEqual({ kind: 'partial', range: { start: 2, end: 5 } });
    expect(parseRangeHeader('bytes=7-', 10)).toEqual({ kind: 'partial', range: { start: 7, end: 9 } });
    expect(parseRangeHeader('bytes=7-100', 10)).toEqual({ kind: 'partial', range: { start: 7, end: 9 } });
    expect(parseRangeHeader('bytes=-3', 10)).toEqual({ kind: 'partial', range: { start: 7, end: 9 } });
    expect(parseRangeHeader('bytes=-30', 10)).toEqual({ kind: 'partial', range: { start: 0, end: 9 } });
  });

  it('reports ranges that start beyond the end as unsatisfiable', () => {
    expect(parseRangeHeader('bytes=10-20', 10)).toEqual({ kind: 'unsatisfiable' });
    expect(parseRangeHeader('bytes=-0', 10)).toEqual({ kind: 'unsatisfiable' });
    expect(parseRangeHeader('bytes=0-', 0)).toEqual({ kind: 'unsatisfiable' });
  });
});

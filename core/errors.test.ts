import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { decodeErrorBody, ERROR_CATALOGUE, isErrorCode, NestboxError, toNestboxError } from './errors.js';
import { projectPath } from '../src/paths.js';

describe('error catalogue', () => {
  it('gives each code one status and renders code and message', () => {
    const e = new NestboxError('invalid_state', 'cannot', { state: 'stopped' });
    expect(e.status).toBe(409);
    expect(e.toJSON()).toEqual({ code: 'invalid_state', message: 'cannot', details: { state: 'stopped' } });
    expect(toNestboxError(new Error('boom'))).toMatchObject({ code: 'internal', status: 500 });
  });

  it('agrees with every status/code pair the guest agent answers with', () => {
    // The host agent passes guest-agent errors through by code, so a code the catalogue does
    // not know (or knows with another status) would change the status clients see.
    const dir = projectPath('host/guest-agent');
    const pairs: [number, string][] = [];
    for (const file of readdirSync(dir).filter((f) => f.endsWith('.ts') && !f.endsWith('.test.ts'))) {
      for (const m of readFileSync(`${dir}/${file}`, 'utf8').matchAll(/AgentHttpError\((\d{3}), '([a-z_]+)'/g)) pairs.push([Number(m[1]), m[2]]);
    }
    expect(pairs.length).toBeGreaterThan(5);
    for (const [status, code] of pairs) {
      expect(isErrorCode(code), code).toBe(true);
      expect(ERROR_CATALOGUE[code as keyof typeof ERROR_CATALOGUE].status, code).toBe(status);
    }
  });
});

describe('decodeErrorBody (every hop: host agent, guest agent, files view)', () => {
  it('keeps a code of the catalogue with its message and details', () => {
    const e = decodeErrorBody(409, JSON.stringify({ error: { code: 'invalid_state', message: 'stdin is closed', details: { state: 'exited' } } }));
    expect(e.toJSON()).toEqual({ code: 'invalid_state', message: 'stdin is closed', details: { state: 'exited' } });
  });

  it('names an unknown code, or a body without our shape, by its HTTP status', () => {
    expect(decodeErrorBody(409, JSON.stringify({ error: { code: 'brand_new', message: 'taken' } })).toJSON()).toEqual({ code: 'conflict', message: 'taken' });
    expect(decodeErrorBody(404, '<html>nope</html>').code).toBe('not_found');
    expect(decodeErrorBody(503, '').code).toBe('host_unavailable');
    expect(decodeErrorBody(507, '{}').code).toBe('insufficient_storage');
    expect(decodeErrorBody(418, 'teapot').code).toBe('validation_failed');
    expect(decodeErrorBody(500, 'oops', 'host h1').message).toBe('host h1 answered HTTP 500: oops');
    expect(decodeErrorBody(502, '').code).toBe('internal');
  });
});

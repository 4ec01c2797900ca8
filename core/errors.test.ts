import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { ERROR_CATALOGUE, isErrorCode, NestboxError, toNestboxError } from './errors.js';
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

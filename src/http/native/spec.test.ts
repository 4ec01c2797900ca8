import { readFileSync, readdirSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { createNativeBackend, loadNativeSpec, describeValidationErrors, precompileOperationMatching } from './router.js';
import { nativeHandlers } from './handlers/index.js';
import { projectPath } from '../../paths.js';
import { SCOPES } from '../../../core/types.js';

const spec = loadNativeSpec(readFileSync(projectPath('openapi/native.yaml'), 'utf8'));
const operations = Object.values(spec.paths ?? {}).flatMap((item) =>
  Object.entries(item as Record<string, unknown>)
    .filter(([method]) => ['get', 'put', 'post', 'patch', 'delete'].includes(method))
    .map(([, op]) => op as { operationId: string; security?: unknown[]; 'x-nestbox-scope'?: string }),
);

describe('openapi/native.yaml', () => {
  it('has a handler for every operationId and no handler without an operation', () => {
    const ids = operations.map((o) => o.operationId).sort();
    expect(ids.length).toBeGreaterThan(10);
    expect(Object.keys(nativeHandlers).sort()).toEqual(ids);
  });

  it('keeps one handler file per operationId, named after it', () => {
    const files = readdirSync(projectPath('src/http/native/handlers'))
      .filter((f) => f.endsWith('.ts') && f !== 'index.ts' && !f.endsWith('.test.ts'))
      .map((f) => f.replace(/\.ts$/, ''))
      .sort();
    expect(files).toEqual(operations.map((o) => o.operationId).sort());
  });

  it('declares a known scope on every authenticated operation', () => {
    for (const op of operations) {
      if (Array.isArray(op.security) && op.security.length === 0) continue;
      expect(SCOPES, op.operationId).toContain(op['x-nestbox-scope']);
    }
  });
});

describe('validation messages', () => {
  it('name the field for unknown, missing and mistyped fields', () => {
    expect(describeValidationErrors([{ instancePath: '/requestBody', keyword: 'additionalProperties', params: { additionalProperty: 'cpus' } }]).message).toBe('cpus: is not a known field');
    expect(describeValidationErrors([{ instancePath: '/requestBody/memoryMiB', keyword: 'type', message: 'must be integer', params: {} }]).message).toBe('memoryMiB: must be integer');
    expect(describeValidationErrors([{ instancePath: '', keyword: 'required', params: { missingProperty: 'requestBody' } }]).message).toBe('body: is required (a JSON object)');
    expect(describeValidationErrors([{ instancePath: '/query/path', keyword: 'pattern', message: 'must match', params: {} }]).message).toBe('path: must not contain NUL bytes');
  });
});

describe('openapi document validity', () => {
  it('passes openapi-backend strict validation', async () => {
    const api = createNativeBackend(spec);
    api.registerSecurityHandler('bearer', () => true);
    expect(() => api.init()).not.toThrow();
  });
});

describe('precompiled operation matching', () => {
  it('matches every request as openapi-backend does: each operation, each method on its path, trailing slashes, unknown paths', async () => {
    // Each from its own parse: init dereferences the document in place.
    const fresh = () => loadNativeSpec(readFileSync(projectPath('openapi/native.yaml'), 'utf8'));
    const library = createNativeBackend(fresh());
    const fast = createNativeBackend(fresh());
    await library.init();
    await fast.init();
    precompileOperationMatching(fast);
    const ops = library.router.getOperations();
    // A concrete path per operation (each template parameter a plausible value), and its neighbours.
    const paths = new Set<string>(['/', '/nope', '/sandboxes/x/nope', '/sandboxes//x', '/SANDBOXES', '/sandboxes/a.b', '/sandboxes?x=1']);
    for (const op of ops) {
      const concrete = op.path.replace(/\{[^}]+\}/g, 'x1');
      for (const p of [concrete, `${concrete}/`, `${concrete}/extra`, concrete.replace(/\/[^/]*$/, '')]) paths.add(p);
    }
    const outcome = (api: typeof library, method: string, path: string, strict: boolean) => {
      try {
        return api.router.matchOperation({ method, path, headers: {} }, strict)?.operationId ?? 'none';
      } catch (err) {
        return (err as Error).message;
      }
    };
    let compared = 0;
    for (const path of paths) {
      for (const method of ['GET', 'POST', 'PUT', 'PATCH', 'DELETE']) {
        expect(outcome(fast, method, path, true), `${method} ${path}`).toBe(outcome(library, method, path, true));
        compared++;
      }
    }
    expect(compared).toBeGreaterThan(ops.length * 4 * 5 * 0.5);
    // Not strict (undefined instead of a throw), and methods in other spellings.
    for (const [method, path] of [['GET', '/nope'], ['OPTIONS', '/sandboxes'], ['get', '/sandboxes/x1'], ['TRACE', '/sandboxes/x1'], ['delete', '/sandboxes/x1/']]) {
      for (const strict of [true, false]) expect(outcome(fast, method, path, strict), `${method} ${path} strict=${strict}`).toBe(outcome(library, method, path, strict));
    }
    for (const op of ops) expect(fast.router.getOperation(op.operationId!)?.path).toBe(op.path);
  });
});

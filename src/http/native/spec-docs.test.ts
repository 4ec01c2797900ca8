// The rendered API reference (/docs) is only as good as openapi/native.yaml: every operation
// explains itself, and every JSON body it takes or answers has an example that is true to its
// schema (an example that drifts from the schema would teach readers a wrong request).
import { readFileSync } from 'node:fs';
import { Ajv, type ValidateFunction } from 'ajv';
import addFormats from 'ajv-formats';
import { describe, expect, it } from 'vitest';
import { loadNativeSpec } from './router.js';
import { nativeHandlers } from './handlers/index.js';
import { projectPath } from '../../paths.js';

interface MediaType {
  schema?: unknown;
  example?: unknown;
  examples?: Record<string, { $ref?: string; value?: unknown }>;
}
interface Operation {
  operationId: string;
  description?: string;
  requestBody?: { content?: Record<string, MediaType> };
  responses: Record<string, { $ref?: string; content?: Record<string, MediaType> }>;
}

const spec = loadNativeSpec(readFileSync(projectPath('openapi/native.yaml'), 'utf8')) as unknown as {
  paths: Record<string, Record<string, unknown>>;
  components: { examples?: Record<string, { value?: unknown }> };
};
const METHODS = ['get', 'put', 'post', 'patch', 'delete'];
const pointerPart = (s: string) => s.replace(/~/g, '~0').replace(/\//g, '~1');

const operations = Object.entries(spec.paths).flatMap(([path, item]) =>
  Object.entries(item)
    .filter(([method]) => METHODS.includes(method))
    .map(([method, op]) => ({ path, method, op: op as Operation, pointer: `#/paths/${pointerPart(path)}/${method}` })),
);

/** One JSON body of an operation: where it is (for messages and the schema's JSON pointer) and its media type. */
interface JsonBody {
  where: string;
  pointer: string;
  media: MediaType;
}

function jsonBodies(): JsonBody[] {
  const bodies: JsonBody[] = [];
  for (const { op, pointer } of operations) {
    for (const [type, media] of Object.entries(op.requestBody?.content ?? {})) {
      if (/json/.test(type)) bodies.push({ where: `${op.operationId} request ${type}`, pointer: `${pointer}/requestBody/content/${pointerPart(type)}`, media });
    }
    for (const [status, response] of Object.entries(op.responses)) {
      if (!/^2/.test(status)) continue;
      for (const [type, media] of Object.entries(response.content ?? {})) {
        if (/json/.test(type)) bodies.push({ where: `${op.operationId} ${status} ${type}`, pointer: `${pointer}/responses/${status}/content/${pointerPart(type)}`, media });
      }
    }
  }
  return bodies;
}

/** A media type's examples by name, `components/examples` references followed. */
function examplesOf(media: MediaType): { name: string; value: unknown }[] {
  const found: { name: string; value: unknown }[] = [];
  if (media.example !== undefined) found.push({ name: 'example', value: media.example });
  for (const [name, entry] of Object.entries(media.examples ?? {})) {
    if (entry.$ref) {
      const key = /^#\/components\/examples\/(.+)$/.exec(entry.$ref)?.[1];
      const target = key ? spec.components.examples?.[key] : undefined;
      if (!target) throw new Error(`example ${name}: ${entry.$ref} does not exist`);
      found.push({ name, value: target.value });
    } else {
      found.push({ name, value: entry.value });
    }
  }
  return found;
}

// The whole document is one schema resource, so `$ref: '#/components/schemas/…'` inside it
// resolves as it does for openapi-backend. Ajv knows OpenAPI's `nullable` (beside a `type`);
// strict mode is off for OpenAPI's own keywords (`example`, `x-…`, `format: binary`).
const ajv = new Ajv({ strict: false, allErrors: true });
(addFormats as unknown as (a: Ajv) => void)(ajv);
ajv.addFormat('binary', true);
ajv.addSchema(spec as object, 'native.json');
const validatorFor = (pointer: string): ValidateFunction => ajv.compile({ $ref: `native.json${pointer}/schema` });

describe('openapi/native.yaml as a reference', () => {
  it('walks every operation (one per handler)', () => {
    expect(operations.map(({ op }) => op.operationId).sort()).toEqual(Object.keys(nativeHandlers).sort());
  });

  it('describes every operation (what it does, what it needs)', () => {
    const undescribed = operations.filter(({ op }) => typeof op.description !== 'string' || op.description.trim().length < 40).map(({ op }) => op.operationId);
    expect(undescribed).toEqual([]);
  });

  it('has an example for every JSON request body and every JSON 2xx response', () => {
    const bodies = jsonBodies();
    expect(bodies.length).toBeGreaterThan(80);
    const missing = bodies.filter(({ media }) => examplesOf(media).length === 0).map(({ where }) => where);
    expect(missing).toEqual([]);
  });

  it('has only examples that are valid against their schemas', () => {
    const invalid: string[] = [];
    let checked = 0;
    for (const { where, pointer, media } of jsonBodies()) {
      const validate = validatorFor(pointer);
      for (const { name, value } of examplesOf(media)) {
        checked++;
        if (!validate(value)) invalid.push(`${where} (${name}): ${ajv.errorsText(validate.errors)}`);
      }
    }
    expect(checked).toBeGreaterThan(80);
    expect(invalid).toEqual([]);
  });

  it('would notice an example that drifts from its schema', () => {
    // The validator above is the one that judges the examples: it refuses what the schema refuses.
    const createSandbox = operations.find(({ op }) => op.operationId === 'createSandbox')!;
    const request = validatorFor(`${createSandbox.pointer}/requestBody/content/application~1json`);
    const [example] = examplesOf(createSandbox.op.requestBody!.content!['application/json']);
    expect(request(example.value)).toBe(true);
    expect(request({ ...(example.value as object), cpus: 2 })).toBe(false);
    expect(request({ ...(example.value as object), memoryMiB: 'lots' })).toBe(false);

    const getSandbox = operations.find(({ op }) => op.operationId === 'getSandbox')!;
    const response = validatorFor(`${getSandbox.pointer}/responses/200/content/application~1json`);
    const [sandbox] = examplesOf(getSandbox.op.responses['200'].content!['application/json']);
    expect(response(sandbox.value)).toBe(true);
    const { state: _state, ...withoutState } = sandbox.value as Record<string, unknown>;
    expect(response(withoutState)).toBe(false);
    expect(response({ ...(sandbox.value as object), expiresAt: 'tomorrow' })).toBe(false);
    // `nullable` is honoured: null where the schema allows it, refused where it does not.
    expect(response({ ...(sandbox.value as object), stoppedAt: null })).toBe(true);
    expect(response({ ...(sandbox.value as object), cpu: null })).toBe(false);
  });
});

// Validation of request bodies against the vendored, version-pinned Cloud Hypervisor API
// description (test-only). Real CH silently ignores unknown fields (no deny_unknown_fields in
// vm_config.rs), so a typo like `shraed` would do nothing in production and nothing in a test;
// here every object schema with declared properties is closed (`additionalProperties: false`)
// and integer formats are checked, so such a mistake fails the test instead.
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Ajv, type ValidateFunction } from 'ajv';
import { load as loadYaml } from 'js-yaml';

export const PINNED_CH_VERSION = 'v53.0';

/** Where the pinned YAML lives: `NESTBOX_CH_API_SPEC`, else the repository's `vendor/cloud-hypervisor/`. */
export function defaultSpecPath(): string {
  if (process.env.NESTBOX_CH_API_SPEC) return process.env.NESTBOX_CH_API_SPEC;
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 8; i++) {
    const candidate = resolve(dir, 'vendor', 'cloud-hypervisor', `cloud-hypervisor-${PINNED_CH_VERSION}.yaml`);
    try {
      readFileSync(candidate, { flag: 'r' });
      return candidate;
    } catch {
      dir = dirname(dir);
    }
  }
  throw new Error(`cannot find cloud-hypervisor-${PINNED_CH_VERSION}.yaml; set NESTBOX_CH_API_SPEC`);
}

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** Deep copy with every object schema that lists properties closed. */
export function closeObjectSchemas(schema: Json): Json {
  if (Array.isArray(schema)) return schema.map(closeObjectSchemas);
  if (!schema || typeof schema !== 'object') return schema;
  const out: { [key: string]: Json } = {};
  for (const [key, value] of Object.entries(schema)) out[key] = closeObjectSchemas(value);
  if (out.type === 'object' && out.properties && out.additionalProperties === undefined) out.additionalProperties = false;
  return out;
}

const INTEGER_RANGES: Record<string, [number, number]> = {
  int8: [-128, 127],
  uint8: [0, 255],
  int16: [-32768, 32767],
  uint16: [0, 65535],
  int32: [-(2 ** 31), 2 ** 31 - 1],
  uint32: [0, 2 ** 32 - 1],
  // JSON numbers beyond 2^53 lose precision anyway; CH's u64/i64 sizes stay far below.
  int64: [Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER],
  uint64: [0, Number.MAX_SAFE_INTEGER],
};

export interface ChSchemaValidator {
  /** Error messages (empty = valid) for a body against `#/components/schemas/<name>`. */
  validate(schemaName: string, body: unknown): string[];
  schemaNames(): string[];
}

export function loadChSchemas(specPath = defaultSpecPath()): ChSchemaValidator {
  const document = loadYaml(readFileSync(specPath, 'utf8')) as { components: { schemas: Record<string, Json> } };
  const schemas = closeObjectSchemas(document.components.schemas as Json) as Record<string, Json>;
  // strict: false because OpenAPI adds keywords JSON Schema lacks (e.g. `example`); types stay strict.
  const ajv = new Ajv({ strict: false, allErrors: true });
  for (const [name, [min, max]] of Object.entries(INTEGER_RANGES)) {
    ajv.addFormat(name, { type: 'number', validate: (value: number) => Number.isInteger(value) && value >= min && value <= max });
  }
  ajv.addSchema({ $id: 'ch', components: { schemas } }, 'ch');
  const compiled = new Map<string, ValidateFunction>();
  return {
    validate(schemaName, body) {
      if (!(schemaName in schemas)) throw new Error(`no schema ${schemaName} in ${specPath}`);
      let validator = compiled.get(schemaName);
      if (!validator) {
        validator = ajv.getSchema(`ch#/components/schemas/${schemaName}`);
        if (!validator) throw new Error(`cannot compile ${schemaName}`);
        compiled.set(schemaName, validator);
      }
      if (validator(body)) return [];
      return (validator.errors ?? []).map((error) => {
        const extra = error.keyword === 'additionalProperties' ? ` "${(error.params as { additionalProperty: string }).additionalProperty}"` : '';
        return `${schemaName}${error.instancePath || ''}: ${error.message}${extra}`;
      });
    },
    schemaNames: () => Object.keys(schemas),
  };
}

/** The pinned YAML's path relative to this file's repo, for messages. */
export function describeSpec(specPath = defaultSpecPath()): string {
  return join(dirname(specPath), `cloud-hypervisor-${PINNED_CH_VERSION}.yaml`);
}

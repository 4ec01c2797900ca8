// Placeholders until the build inputs (core/images/dockerfile.ts, copy-archive.ts) and the
// filesystem object store (src/object-store/) land: the engine runs RUN-only builds meanwhile.
import type { Config } from './config.js';
import type { BuildInputTools } from '../core/services/image-builds.js';
import type { ObjectStore } from '../core/object-store.js';
import { NestboxError } from '../core/errors.js';

const unavailable = (): never => {
  throw new NestboxError('not_supported', 'build contexts are not available in this build of Nestbox yet');
};

export const buildInputTools: BuildInputTools = {
  expandWords: (text, vars) => text.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)/g, (_m, a: string | undefined, b: string | undefined) => vars[(a ?? b)!] ?? ''),
  composeCopyArchive: async () => unavailable(),
  globBase: (pattern) => pattern.split('/').filter((part, i, all) => !/[*?[\]{}]/.test(all.slice(0, i + 1).join('/'))).join('/'),
};

export function createObjectStore(_config: Config): ObjectStore {
  return {
    put: async () => unavailable(),
    head: async () => undefined,
    read: async () => unavailable(),
    list: async () => [],
    delete: async () => {},
    createMultipart: async () => unavailable(),
    putPart: async () => unavailable(),
    completeMultipart: async () => unavailable(),
    abortMultipart: async () => {},
  };
}

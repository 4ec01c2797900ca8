// The build engine's inputs side (core/images/), handed to it by the composition root, and the
// object store the server keeps build contexts in.
import type { Config } from './config.js';
import type { BuildInputTools } from '../core/services/image-builds.js';
import type { ObjectStore } from '../core/object-store.js';
import { NestboxError } from '../core/errors.js';
import { expandWords } from '../core/images/dockerfile.js';
import { composeCopyArchive, globBase, resolveCopyDest } from '../core/images/copy-archive.js';

export const buildInputTools: BuildInputTools = {
  expandWords: (text, vars, options) => expandWords(text, vars, { line: options?.line }),
  composeCopyArchive,
  globBase,
  resolveCopyDest,
};

const unavailable = (): never => {
  throw new NestboxError('not_supported', 'build contexts are not available in this build of Nestbox yet');
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

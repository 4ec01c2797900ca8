// The build engine's inputs side (core/images/), handed to it by the composition root.
import type { BuildInputTools } from '../core/services/image-builds.js';
import { expandWords } from '../core/images/dockerfile.js';
import { composeCopyArchive, globBase, resolveCopyDest } from '../core/images/copy-archive.js';

export const buildInputTools: BuildInputTools = {
  expandWords: (text, vars, options) => expandWords(text, vars, { line: options?.line }),
  composeCopyArchive,
  globBase,
  resolveCopyDest,
};

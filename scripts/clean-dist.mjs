// Empties dist/ before a build, so it holds only what this build emits: tsc never deletes, and a
// file emitted once (a module since moved or deleted, a test helper before tsconfig.json excluded
// it) would otherwise keep shipping and could still be imported from dist/ at run time.
import { rmSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

rmSync(resolve(dirname(fileURLToPath(import.meta.url)), '..', 'dist'), { recursive: true, force: true });

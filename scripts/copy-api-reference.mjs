// Copies Scalar's self-contained browser bundle (a devDependency) into dist/docs/, where the
// server's /docs route reads it (src/http/api-docs.ts): the installed server then needs no
// node_modules and no CDN to render the API reference.
//
// Usage: node scripts/copy-api-reference.mjs   (run by `npm run build`, after tsc)
import { copyFileSync, mkdirSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
// The package's `exports` does not expose this file (nor package.json), so it is read by path.
const bundle = resolve(repoRoot, 'node_modules/@scalar/api-reference/dist/browser/standalone.js');
const outDir = resolve(repoRoot, 'dist/docs');
mkdirSync(outDir, { recursive: true });
copyFileSync(bundle, resolve(outDir, 'standalone.js'));

// Bundles the guest agent into one self-contained ESM file (zod included) that the sandbox's
// private node runs: /.nestbox/bin/node /.nestbox/lib/guest-agent.mjs --socket …
// The sandbox has no node_modules, so nothing may stay external except Node's built-ins.
//
// Usage: node scripts/bundle-guest-agent.mjs [--outfile <path>]   (default dist/guest-agent.mjs)
import { build } from 'esbuild';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const { values } = parseArgs({ options: { outfile: { type: 'string' } } });
const outfile = resolve(values.outfile ?? resolve(repoRoot, 'dist/guest-agent.mjs'));

await build({
  entryPoints: [resolve(repoRoot, 'host/guest-agent/main.ts')],
  outfile,
  bundle: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  sourcemap: false,
  legalComments: 'none',
  logLevel: 'warning',
  // An ESM bundle has no `require`; give one to any CommonJS code that esbuild inlines so a
  // dependency calling require('node:…') keeps working.
  banner: {
    js: "import { createRequire as __nestboxCreateRequire } from 'node:module'; const require = __nestboxCreateRequire(import.meta.url);",
  },
});
console.log(`guest agent bundled to ${outfile}`);

// Bundles the guest agent into a self-contained ESM entry file (zod included) that the sandbox's
// private node runs: /.nestbox/bin/node /.nestbox/lib/guest-agent.mjs --socket …, and the chunks
// it imports lazily, in the directory guest-agent-chunks/ beside it (GUEST_AGENT_CHUNKS_DIR in
// host/agent-protocol/bundle.ts): the parts a request rarely needs (code interpreter, language
// servers, OpenTelemetry, tar, ws) are dynamic import()s, so the agent parses and evaluates
// about a third of its code before it listens (issue 20). Whoever ships the entry ships the
// chunk directory with it, as read-only to the sandbox as the entry.
// The sandbox has no node_modules, so nothing may stay external except Node's built-ins.
//
// Usage: node scripts/bundle-guest-agent.mjs [--outfile <path>] [--metafile <path>]
//   --outfile   the entry (default dist/guest-agent.mjs); the chunks go into guest-agent-chunks/ beside it
//   --metafile  also write esbuild's metafile (what each output holds, by input) there
// Also builds the PTY helper next to the bundle (dist/nestbox-pty); needs cc and libc6-dev.
import { build } from 'esbuild';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { basename, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const { values } = parseArgs({ options: { outfile: { type: 'string' }, metafile: { type: 'string' } } });
const outfile = resolve(values.outfile ?? resolve(repoRoot, 'dist/guest-agent.mjs'));
if (!outfile.endsWith('.mjs')) throw new Error('--outfile must end in .mjs');
/** Must match GUEST_AGENT_CHUNKS_DIR (host/agent-protocol/bundle.ts), where the drivers look for it. */
const CHUNKS_DIR = 'guest-agent-chunks';
const chunksDir = resolve(dirname(outfile), CHUNKS_DIR);

/**
 * OpenTelemetry's packages (the guest agent's spans, host/guest-agent/tracing.ts) are resolved to
 * their ES-module builds, which esbuild can tree-shake: their CommonJS `main` would bring the
 * whole of each package (semantic conventions, protobuf encoders), about 600 kB more.
 */
const openTelemetryAsEsm = {
  name: 'opentelemetry-esm',
  setup(build) {
    build.onResolve({ filter: /^@opentelemetry\/[^/]+$/ }, async (args) => {
      if (args.pluginData === 'opentelemetry-esm') return undefined;
      // Resolved as usual first (so a nested copy of another version is the one used), then
      // the package's own `module` entry instead of its `main`.
      const found = await build.resolve(args.path, { kind: args.kind, resolveDir: args.resolveDir, importer: args.importer, pluginData: 'opentelemetry-esm' });
      if (found.errors.length) return { errors: found.errors };
      let dir = dirname(found.path);
      while (!existsSync(resolve(dir, 'package.json')) && dirname(dir) !== dir) dir = dirname(dir);
      const pkg = JSON.parse(readFileSync(resolve(dir, 'package.json'), 'utf8'));
      return { path: pkg.name === args.path && pkg.module ? resolve(dir, pkg.module) : found.path };
    });
  },
};

/**
 * zod's namespace object (`z`) re-exports every translation of its error messages (`z.locales`),
 * a third of zod's size, which esbuild cannot drop because `z` is used as an object. The agent
 * speaks English only (zod's default, which schemas.js imports itself), so the index of locales
 * becomes a module holding just that one.
 */
const zodEnglishOnly = {
  name: 'zod-english-only',
  setup(build) {
    build.onResolve({ filter: /^\.\.\/locales\/index\.js$/ }, (args) => {
      if (!/[\\/]zod[\\/]v4[\\/](classic|core|mini)[\\/]/.test(args.importer)) return undefined;
      return { path: resolve(dirname(args.importer), '../locales/en.js'), namespace: 'zod-english-only' };
    });
    build.onLoad({ filter: /.*/, namespace: 'zod-english-only' }, (args) => ({
      contents: `export { default as en } from ${JSON.stringify(args.path)};`,
      resolveDir: dirname(args.path),
      loader: 'js',
    }));
  },
};

/** Every .py file of host/guest-agent/code-interpreter/, by name. */
function codeInterpreterFiles() {
  const dir = resolve(repoRoot, 'host/guest-agent/code-interpreter');
  return Object.fromEntries(readdirSync(dir).filter((name) => name.endsWith('.py')).map((name) => [name, readFileSync(resolve(dir, name), 'utf8')]));
}

// Chunk names carry a content hash: stale ones from an earlier build would linger and be shipped.
rmSync(chunksDir, { recursive: true, force: true });
const result = await build({
  entryPoints: [{ in: resolve(repoRoot, 'host/guest-agent/main.ts'), out: basename(outfile, '.mjs') }],
  outdir: dirname(outfile),
  outExtension: { '.js': '.mjs' },
  chunkNames: `${CHUNKS_DIR}/[name]-[hash]`,
  splitting: true,
  metafile: true,
  bundle: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  sourcemap: false,
  legalComments: 'none',
  logLevel: 'warning',
  plugins: [openTelemetryAsEsm, zodEnglishOnly],
  // ws tries optional native add-ons (bufferutil, utf-8-validate) with a runtime require; inside
  // a sandbox that lookup walks up to /node_modules, which the sandbox itself can write, so a
  // planted package would run inside the agent. Folded to constants, the lookups are dead code.
  // The code interpreter's Python programs (the kernel bridge, its display hooks, the script
  // runner) travel inside the bundle as string constants (code-interpreter/kernel-program.ts).
  define: {
    'process.env.WS_NO_BUFFER_UTIL': '"1"',
    'process.env.WS_NO_UTF_8_VALIDATE': '"1"',
    NESTBOX_CODE_INTERPRETER_FILES: JSON.stringify(codeInterpreterFiles()),
  },
  // An ESM bundle has no `require`; give one to any CommonJS code that esbuild inlines so a
  // dependency calling require('node:…') keeps working.
  banner: {
    js: "import { createRequire as __nestboxCreateRequire } from 'node:module'; const require = __nestboxCreateRequire(import.meta.url);",
  },
});
if (values.metafile) writeFileSync(resolve(values.metafile), JSON.stringify(result.metafile));
// The agent must never load code from the sandbox's file system: in the entry and in every chunk,
// any runtime require left must name a Node built-in, and any import (static or dynamic) must be
// a built-in or one of the bundle's own files, by a relative path that stays beside the entry.
const builtins = new Set([...builtinModules, ...builtinModules.map((name) => `node:${name}`)]);
const outputs = Object.keys(result.metafile.outputs).map((path) => resolve(path));
for (const output of outputs) {
  if (output !== outfile && dirname(output) !== chunksDir) throw new Error(`esbuild wrote ${output}, outside the entry and its chunk directory`);
  const foreign = [...readFileSync(output, 'utf8').matchAll(/__require\(["']([^"']+)["']\)/g)].map((match) => match[1]).filter((name) => !builtins.has(name));
  if (foreign.length) throw new Error(`the guest agent bundle (${output}) would load ${[...new Set(foreign)].join(', ')} at run time from the sandbox's file system`);
  for (const imported of result.metafile.outputs[Object.keys(result.metafile.outputs).find((path) => resolve(path) === output)].imports) {
    if (imported.external ? builtins.has(imported.path) : outputs.includes(resolve(imported.path))) continue;
    throw new Error(`the guest agent bundle (${output}) imports ${imported.path}, which is not one of its own files`);
  }
}
// A CommonJS package that is import()ed lazily becomes a chunk whose only export is `default`
// (its module.exports), unlike in the one-file bundle, where named imports of it worked: the
// importing code must read `default` (lsp.ts does); any other such chunk fails the build here.
const CJS_DYNAMIC_IMPORTS_READ_AS_DEFAULT = ['node_modules/vscode-languageserver-protocol/'];
for (const [path, output] of Object.entries(result.metafile.outputs)) {
  if (!output.entryPoint?.includes('node_modules/') || output.exports.join() !== 'default') continue;
  if (!CJS_DYNAMIC_IMPORTS_READ_AS_DEFAULT.some((allowed) => output.entryPoint.includes(allowed))) {
    throw new Error(`${path} (${output.entryPoint}) is CommonJS imported with import(): its chunk exports only \`default\`; read it from there and list it in CJS_DYNAMIC_IMPORTS_READ_AS_DEFAULT`);
  }
}
console.log(`guest agent bundled to ${outfile} (${readFileSync(outfile).length} bytes at boot) and ${outputs.length - 1} chunks in ${chunksDir}`);

// The PTY helper (host/guest-agent/pty-helper/nestbox-pty.c): static, so it runs in any sandbox
// image; bind-mounted read-only at /.nestbox/bin/nestbox-pty by the local driver.
const ptyHelper = resolve(dirname(outfile), 'nestbox-pty');
// It also carries the agent's file-metadata (xattr) mode, nestbox-xattr.c.
execFileSync(
  'cc',
  ['-static', '-O2', '-Wall', '-Wextra', '-o', ptyHelper, resolve(repoRoot, 'host/guest-agent/pty-helper/nestbox-pty.c'), resolve(repoRoot, 'host/guest-agent/pty-helper/nestbox-xattr.c')],
  { stdio: 'inherit' },
);
console.log(`pty helper built to ${ptyHelper}`);

// nestbox-enter (host/guest-agent/pty-helper/nestbox-enter.c): puts each workload process in the
// sandbox's workload cgroup and user namespace before it runs; mounted at
// /.nestbox/bin/nestbox-enter; linked statically with libseccomp (its own setns filter).
const enterHelper = resolve(dirname(outfile), 'nestbox-enter');
execFileSync('cc', ['-static', '-O2', '-Wall', '-Wextra', '-o', enterHelper, resolve(repoRoot, 'host/guest-agent/pty-helper/nestbox-enter.c'), '-lseccomp'], { stdio: 'inherit' });
console.log(`workload launcher built to ${enterHelper}`);

// nestbox-rootfs (host/guest-agent/pty-helper/nestbox-rootfs.c): runs on the host in the launcher
// (stage 2) to make the sandbox's user namespace and mount its root from idmapped layers.
const rootfsHelper = resolve(dirname(outfile), 'nestbox-rootfs');
execFileSync('cc', ['-static', '-O2', '-Wall', '-Wextra', '-o', rootfsHelper, resolve(repoRoot, 'host/guest-agent/pty-helper/nestbox-rootfs.c')], { stdio: 'inherit' });
console.log(`root filesystem helper built to ${rootfsHelper}`);

// nestbox-seccomp (host/guest-agent/pty-helper/nestbox-seccomp.c): installs the sandbox's seccomp
// profile before tini; linked statically with libseccomp (libseccomp-dev).
const seccompHelper = resolve(dirname(outfile), 'nestbox-seccomp');
execFileSync('cc', ['-static', '-O2', '-Wall', '-Wextra', '-o', seccompHelper, resolve(repoRoot, 'host/guest-agent/pty-helper/nestbox-seccomp.c'), '-lseccomp'], { stdio: 'inherit' });
console.log(`seccomp helper built to ${seccompHelper}`);

// Bundles the guest agent into one self-contained ESM file (zod included) that the sandbox's
// private node runs: /.nestbox/bin/node /.nestbox/lib/guest-agent.mjs --socket …
// The sandbox has no node_modules, so nothing may stay external except Node's built-ins.
//
// Usage: node scripts/bundle-guest-agent.mjs [--outfile <path>]   (default dist/guest-agent.mjs)
// Also builds the PTY helper next to the bundle (dist/nestbox-pty); needs cc and libc6-dev.
import { build } from 'esbuild';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const { values } = parseArgs({ options: { outfile: { type: 'string' } } });
const outfile = resolve(values.outfile ?? resolve(repoRoot, 'dist/guest-agent.mjs'));

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

/** Every .py file of host/guest-agent/code-interpreter/, by name. */
function codeInterpreterFiles() {
  const dir = resolve(repoRoot, 'host/guest-agent/code-interpreter');
  return Object.fromEntries(readdirSync(dir).filter((name) => name.endsWith('.py')).map((name) => [name, readFileSync(resolve(dir, name), 'utf8')]));
}

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
  plugins: [openTelemetryAsEsm],
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
// The agent must never load code from the sandbox's file system: any runtime require left in the
// bundle must name a Node built-in.
const builtins = new Set([...builtinModules, ...builtinModules.map((name) => `node:${name}`)]);
const foreign = [...readFileSync(outfile, 'utf8').matchAll(/__require\(["']([^"']+)["']\)/g)].map((match) => match[1]).filter((name) => !builtins.has(name));
if (foreign.length) throw new Error(`the guest agent bundle would load ${[...new Set(foreign)].join(', ')} at run time from the sandbox's file system`);
console.log(`guest agent bundled to ${outfile}`);

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

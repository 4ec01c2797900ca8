// Installs the simulator as a `cloud-hypervisor` executable for tests: bundles main.ts with
// esbuild (Node cannot run TypeScript) into a temp dir and writes a wrapper script that sets the
// simulator's own environment, so the driver spawns it exactly like the real binary.
import { chmod, mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { build } from 'esbuild';
import { projectPath } from '../../../src/paths.js';
import { defaultSpecPath } from './schema.js';

export interface InstalledSimulator {
  /** The fake `cloud-hypervisor` to hand to the driver as its binary. */
  binary: string;
  /** Write `{ "<sandbox id>": Faults }` here to inject faults at run time. */
  faultsFile: string;
}

export async function installSimulator(dir: string, options: { guestAgentBundle?: string; extraEnv?: Record<string, string> } = {}): Promise<InstalledSimulator> {
  await mkdir(dir, { recursive: true });
  const bundle = join(dir, 'ch-sim.mjs');
  await build({
    entryPoints: [projectPath('host/sim/ch/main.ts')],
    outfile: bundle,
    bundle: true,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    logLevel: 'warning',
    banner: { js: "import { createRequire as __simCreateRequire } from 'node:module'; const require = __simCreateRequire(import.meta.url);" },
  });
  const faultsFile = join(dir, 'faults.json');
  await writeFile(faultsFile, '{}\n');
  const env: Record<string, string> = {
    NESTBOX_CH_SIM_GUEST_AGENT: options.guestAgentBundle ?? projectPath('dist/guest-agent.mjs'),
    NESTBOX_CH_API_SPEC: defaultSpecPath(),
    NESTBOX_CH_SIM_FAULTS: faultsFile,
    ...options.extraEnv,
  };
  const exports = Object.entries(env)
    .map(([name, value]) => `export ${name}=${shellQuote(value)}`)
    .join('\n');
  const binary = join(dir, 'cloud-hypervisor');
  await writeFile(binary, `#!/bin/sh\n# Cloud Hypervisor simulator (nestbox tests)\n${exports}\nexec ${shellQuote(process.execPath)} ${shellQuote(bundle)} "$@"\n`);
  await chmod(binary, 0o755);
  return { binary, faultsFile };
}

function shellQuote(value: string): string {
  return `'${value.replace(/'/g, `'\\''`)}'`;
}

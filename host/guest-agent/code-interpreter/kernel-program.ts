// The code kernel's program, shipped with the guest agent (POST /kernels starts it). In the
// bundle the sandbox runs, scripts/bundle-guest-agent.mjs inlines kernel.py as the constant
// below; run from the sources (tests), the agent reads the file beside this one.
import { readFileSync } from 'node:fs';

/** Defined by the bundler: the text of kernel.py. */
declare const NESTBOX_PYTHON_KERNEL: string | undefined;

let program: string | undefined;

export function pythonKernelProgram(): string {
  program ??= typeof NESTBOX_PYTHON_KERNEL === 'string' ? NESTBOX_PYTHON_KERNEL : readFileSync(new URL('./kernel.py', import.meta.url), 'utf8');
  return program;
}

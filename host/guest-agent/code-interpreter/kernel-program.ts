// The guest agent's code-interpreter programs, shipped inside it: the Jupyter kernel bridge
// (bridge.py, POST /kernels) with the python display hooks (python_display.py) folded in, and
// the one-shot script runner (script_runner.py, POST /scripts). In the bundle the sandbox runs,
// scripts/bundle-guest-agent.mjs inlines the files as the constants below; run from the sources
// (tests), the agent reads the files beside this one.
import { readFileSync } from 'node:fs';

/** Defined by the bundler: the text of each program, by file name. */
declare const NESTBOX_CODE_INTERPRETER_FILES: Record<string, string> | undefined;

function source(name: string): string {
  if (typeof NESTBOX_CODE_INTERPRETER_FILES === 'object' && NESTBOX_CODE_INTERPRETER_FILES[name] !== undefined) return NESTBOX_CODE_INTERPRETER_FILES[name];
  return readFileSync(new URL(`./${name}`, import.meta.url), 'utf8');
}

let bridge: string | undefined;
let runner: string | undefined;

/** The kernel bridge, run as `python3 -u -c <program> --language …`. */
export function kernelBridgeProgram(): string {
  // The hooks go in as a Python string literal; a JSON string is one (same escapes).
  bridge ??= source('bridge.py').replace('__NESTBOX_PYTHON_DISPLAY__', () => JSON.stringify(source('python_display.py')));
  return bridge;
}

/** The one-shot python script runner, run as `python3 -u -c <program> <args…>` with the code on stdin. */
export function scriptRunnerProgram(): string {
  runner ??= source('script_runner.py').replace('__NESTBOX_PYTHON_DISPLAY__', () => JSON.stringify(source('python_display.py')));
  return runner;
}

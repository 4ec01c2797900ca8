import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

let root: string | undefined;

/**
 * The project root, found by walking up to package.json. Works from the TypeScript sources
 * (tests) and from dist/ (the installed program) alike.
 */
export function projectRoot(): string {
  if (root) return root;
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) {
    const parent = dirname(dir);
    if (parent === dir) throw new Error('cannot find the Nestbox project root (package.json)');
    dir = parent;
  }
  root = dir;
  return dir;
}

export const projectPath = (...parts: string[]): string => join(projectRoot(), ...parts);

/** Compiled entry points; `npm run build` produces them. */
export const CLI_ENTRY = (): string => projectPath('dist/src/cli.js');
export const GUEST_AGENT_BUNDLE = (): string => projectPath('dist/guest-agent.mjs');

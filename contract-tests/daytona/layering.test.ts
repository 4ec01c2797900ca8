// The Daytona layer only translates onto core (issue 12): it reaches sandboxes through core's
// typed toolbox, never through the untyped guest channel or a guest-agent path; it imports
// nothing of src/ (it receives CompatPort plus its options); its modules form no import circle.
// Read from the sources, so a regression fails here before any review.
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { projectPath } from '../../src/paths.js';

const dir = projectPath('compat/daytona');
const files = readdirSync(dir).filter((f) => f.endsWith('.ts') && !f.endsWith('.test.ts'));
const source = (f: string) => readFileSync(join(dir, f), 'utf8');
/** Every module specifier a file imports or re-exports. */
const specifiers = (text: string) => [...text.matchAll(/(?:import|export)\s[^;]*?from\s+'([^']+)'/g)].map((m) => m[1]!);

describe('compat/daytona', () => {
  it('has modules to check', () => {
    expect(files).toEqual(expect.arrayContaining(['router.ts', 'toolbox.ts', 'websockets.ts', 'git.ts']));
  });

  it('never uses the untyped guest channel or builds a guest-agent path', () => {
    for (const f of files) {
      const text = source(f);
      expect(text, f).not.toMatch(/agentRequest|fileReadRequest|agentWebSocket|forwardToAgent|agentRaw|agentJson|sandboxes\.exec\(/);
      expect(text, f).not.toMatch(/['`]\/(processes|sessions|exec)\b/);
      expect(text, f).not.toMatch(/['`]\/files\/(list|stat|mkdir|content|chmod|chown|watch|watchers)\b/);
    }
  });

  it('imports nothing of src/ and no guest-agent wire types', () => {
    for (const f of files) {
      for (const spec of specifiers(source(f))) {
        if (!spec.startsWith('.')) continue;
        const target = relative(projectPath('.'), resolve(dir, spec));
        expect(target, `${f} imports ${spec}`).not.toMatch(/^src\//);
        expect(target, `${f} imports ${spec}`).not.toMatch(/^host\/(agent-protocol|guest-agent)\//);
      }
    }
  });

  it('has no import circle among its modules', () => {
    const edges = new Map<string, string[]>();
    for (const f of files) {
      edges.set(f, specifiers(source(f)).filter((s) => s.startsWith('./')).map((s) => s.slice(2).replace(/\.js$/, '.ts')));
    }
    const done = new Set<string>();
    const visit = (f: string, path: string[]): void => {
      expect(path, `import circle: ${[...path, f].join(' → ')}`).not.toContain(f);
      if (done.has(f)) return;
      for (const next of edges.get(f) ?? []) visit(next, [...path, f]);
      done.add(f);
    };
    for (const f of files) visit(f, []);
  });
});

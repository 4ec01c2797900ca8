// The native handlers reach the sandbox only through the toolbox, and the toolbox's one scope
// table agrees with the scope each operation declares in openapi/native.yaml (the router checks
// that one first; the toolbox checks its own again, so the two must never disagree).
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { loadNativeSpec } from './router.js';
import { projectPath } from '../../paths.js';
import { Toolbox, TOOLBOX_OPERATIONS, type ToolboxOperation } from '../../../core/services/toolbox.js';

const spec = loadNativeSpec(readFileSync(projectPath('openapi/native.yaml'), 'utf8'));
const scopeOf = new Map<string, string>();
for (const item of Object.values(spec.paths ?? {})) {
  for (const [method, op] of Object.entries(item as Record<string, { operationId?: string; 'x-nestbox-scope'?: string }>)) {
    if (['get', 'put', 'post', 'patch', 'delete'].includes(method) && op.operationId) scopeOf.set(op.operationId, op['x-nestbox-scope'] ?? '');
  }
}

/** Toolbox method → its row of the table: its own name, the WebSocket variants share their operation's (test/toolbox.test.ts checks each method uses it). */
function toolboxOperations(): Map<string, ToolboxOperation> {
  const map = new Map<string, ToolboxOperation>();
  for (const method of Object.getOwnPropertyNames(Toolbox.prototype)) {
    const operation = method.replace(/Socket$/, '');
    if (operation in TOOLBOX_OPERATIONS) map.set(method, operation as ToolboxOperation);
  }
  return map;
}

const handlerDir = projectPath('src/http/native/handlers');
const handlerFiles = readdirSync(handlerDir).filter((f) => f.endsWith('.ts') && f !== 'index.ts');

describe('native handlers on the toolbox', () => {
  it('call toolbox methods whose scope is the one the spec declares', () => {
    const operations = toolboxOperations();
    expect(operations.size).toBeGreaterThan(30);
    let calls = 0;
    for (const file of handlerFiles) {
      const operationId = file.replace(/\.ts$/, '');
      const source = readFileSync(`${handlerDir}/${file}`, 'utf8');
      for (const m of source.matchAll(/services\.toolbox\.(\w+)\(/g)) {
        const operation = operations.get(m[1]!);
        expect(operation, `${file}: toolbox.${m[1]} checks no operation of the table`).toBeDefined();
        expect(TOOLBOX_OPERATIONS[operation!].scope, `${operationId} → toolbox.${m[1]}`).toBe(scopeOf.get(operationId));
        calls++;
      }
    }
    expect(calls).toBeGreaterThan(30);
  });

  it('never build a guest-agent path or use the untyped channel', () => {
    for (const file of [...handlerFiles.map((f) => `handlers/${f}`), 'websocket.ts', 'guest-io.ts', 'router.ts', 'context.ts', 'render.ts']) {
      const source = readFileSync(projectPath(`src/http/native/${file}`), 'utf8');
      expect(source, file).not.toMatch(/agentRequest|fileReadRequest|agentWebSocket|forwardToAgent|sandboxes\.exec\(/);
      expect(source, file).not.toMatch(/['`]\/(processes|sessions|files|exec)\b/);
    }
  });
});

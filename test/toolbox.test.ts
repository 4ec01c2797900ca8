// Every toolbox method checks the scope of its own row of TOOLBOX_OPERATIONS before it touches
// a sandbox, whoever calls it (the native router checks the spec's scope first, so only a
// direct call shows the toolbox's own check; compat layers rely on it alone).
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NestboxError } from '../core/errors.js';
import { Toolbox, TOOLBOX_OPERATIONS, type ToolboxOperation } from '../core/services/toolbox.js';
import type { Principal } from '../core/types.js';
import { startTestServer, type TestServer } from './harness.js';
import { allScopesBut, makeKey } from './scope-keys.js';

let t: TestServer;

beforeAll(async () => {
  t = await startTestServer();
}, 180_000);

afterAll(async () => {
  await t?.close();
});

async function refusal(call: () => Promise<unknown>): Promise<NestboxError> {
  try {
    await call();
  } catch (err) {
    if (err instanceof NestboxError) return err;
    throw err;
  }
  throw new Error('expected the call to be refused');
}

/** Public methods of the toolbox that act on a sandbox (keepActive only ticks activity). */
const methods = Object.getOwnPropertyNames(Toolbox.prototype).filter((m) => m !== 'constructor' && m !== 'keepActive' && m !== 'guest' && m !== 'keptActive');

describe('Toolbox scope table', () => {
  it('refuses each method without its own scope, and with it goes on to the sandbox', async () => {
    expect(methods.length).toBeGreaterThan(35);
    const toolbox = t.server.services.toolbox;
    const principal = async (scopes: Parameters<typeof makeKey>[1]): Promise<Principal> => t.server.services.auth.authenticate((await makeKey(t, scopes)).key);
    for (const method of methods) {
      // The WebSocket variants share the row of their HTTP operation.
      const operation = method.replace(/Socket$/, '') as ToolboxOperation;
      expect(TOOLBOX_OPERATIONS[operation], `${method} has a row`).toBeDefined();
      const { scope } = TOOLBOX_OPERATIONS[operation];
      const call = (p: Principal) => () => (toolbox as unknown as Record<string, (...a: unknown[]) => Promise<unknown>>)[method]!.call(toolbox, p, 'nosuchsandbox1', 'x1', {}, {});
      const without = await refusal(call(await principal(allScopesBut(scope))));
      expect(without.code, `${method} without ${scope}`).toBe('forbidden');
      expect(without.message).toContain(scope);
      const withIt = await refusal(call(await principal([scope])));
      expect(withIt.code, `${method} with only ${scope}`).toBe('not_found');
    }
  });
});

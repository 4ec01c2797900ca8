// Shared set-up of the E2B contract tests: a real Nestbox server, and the options that point
// the real SDKs at it (e2b.md (a) "One-server recipe": control plane under /e2b, in-sandbox
// traffic at the root).
import { startTestServer, type TestServer } from '../../test/harness.js';

export interface E2bTestServer extends TestServer {
  /** Options every SDK call takes: apiKey, apiUrl, sandboxUrl. */
  opts: { apiKey: string; apiUrl: string; sandboxUrl: string };
}

export async function startE2bTestServer(env?: Record<string, string>): Promise<E2bTestServer> {
  const server = await startTestServer({ env });
  return { ...server, opts: { apiKey: server.apiKey, apiUrl: `${server.url}/e2b`, sandboxUrl: server.url } };
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

// Shared set-up for the Daytona contract tests: a real Nestbox server (control plane + local
// host agent) and the real @daytonaio/sdk pointed at it, exactly as a user would.
import { Daytona } from '@daytonaio/sdk';
import { startTestServer, type TestServer } from '../../test/harness.js';

export interface DaytonaTestEnv {
  server: TestServer;
  apiUrl: string;
  daytona: Daytona;
}

export async function startDaytonaEnv(serverEnv?: Record<string, string>): Promise<DaytonaTestEnv> {
  // The SDK reads DAYTONA_* from the environment only when the config is incomplete; make sure
  // nothing from the machine leaks in.
  for (const k of Object.keys(process.env)) if (k.startsWith('DAYTONA_')) delete process.env[k];
  const server = await startTestServer({ env: serverEnv });
  const apiUrl = `${server.url}/daytona/api`;
  const daytona = new Daytona({ apiUrl, apiKey: server.apiKey });
  return { server, apiUrl, daytona };
}

/** Plain HTTP with the same key, for what the SDK does not expose (headers, legacy routes). */
export function rawFetch(env: DaytonaTestEnv, path: string, init: RequestInit = {}): Promise<Response> {
  return fetch(`${env.server.url}${path}`, { ...init, headers: { authorization: `Bearer ${env.server.apiKey}`, ...(init.headers as Record<string, string> | undefined) } });
}

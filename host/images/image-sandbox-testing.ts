// One real sandbox of an image for a test file (the image tests): the test server and the
// sandbox are made in beforeAll and closed in afterAll; `run` runs a command in it (bash -lc) as
// a user (root when absent) and expects it to succeed.
import { afterAll, beforeAll, expect } from 'vitest';
import { startTestServer, type TestServer } from '../../test/harness.js';

export interface ImageSandbox {
  readonly t: TestServer;
  readonly id: string;
  run(cmd: string, user?: string): Promise<string>;
}

interface CommandResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

/** `create` is the body of the sandbox's create (image, size, egress). */
export function imageSandbox(create: Record<string, unknown>): ImageSandbox {
  let server: TestServer | undefined;
  let sandboxId: string | undefined;
  beforeAll(async () => {
    server = await startTestServer();
    const created = await server.http.post('/api/v1/sandboxes').set(server.auth).send(create);
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    sandboxId = created.body.id;
  });
  afterAll(async () => {
    await server?.close();
  });
  const box: ImageSandbox = {
    get t() {
      if (!server) throw new Error('the image sandbox is made in beforeAll');
      return server;
    },
    get id() {
      if (!sandboxId) throw new Error('the image sandbox is made in beforeAll');
      return sandboxId;
    },
    async run(cmd: string, user?: string): Promise<string> {
      const res = await box.t.http
        .post(`/api/v1/sandboxes/${box.id}/commands`)
        .set(box.t.auth)
        .send({ cmd, timeoutMs: 300_000, ...(user ? { user } : {}) });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      const result = res.body as CommandResult;
      expect(result.exitCode, `${user ?? 'root'}: ${cmd}\n${result.stdout}\n${result.stderr}`).toBe(0);
      return result.stdout;
    },
  };
  return box;
}

// The guest agent's LSP service where no language server is needed to judge it: the requests it
// refuses, and how it bounds and reports programs that fail to be language servers (one that
// dies at once, one that never answers). Real servers are driven through the SDK in
// contract-tests/daytona/lsp.test.ts.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { AgentHttpError } from './errors.js';
import { LspService, type LspSettings } from './lsp.js';
import { WorkloadLauncher } from './workload.js';

let dir: string;
let service: LspService | undefined;
afterEach(() => {
  service?.close();
  service = undefined;
  rmSync(dir, { recursive: true, force: true });
});

function lsp(settings: Partial<LspSettings> = {}): LspService {
  dir = mkdtempSync(join(tmpdir(), 'nbx-lsp-'));
  service = new LspService({ home: dir, baseEnv: { PATH: '/usr/bin:/bin' }, launcher: new WorkloadLauncher('/nonexistent/nestbox-enter'), ...settings });
  return service;
}

async function failure(call: Promise<unknown>): Promise<AgentHttpError> {
  const error = await call.then(() => undefined, (e: unknown) => e);
  expect(error).toBeInstanceOf(AgentHttpError);
  return error as AgentHttpError;
}

describe('LspService', () => {
  it('names an unsupported language and answers calls to a server never started', async () => {
    const service = lsp();
    const unsupported = await failure(service.start({ languageId: 'ruby', pathToProject: dir }));
    expect([unsupported.status, unsupported.code]).toEqual([400, 'validation_failed']);
    expect(unsupported.message).toBe('languageId: unsupported language "ruby" (supported: python, typescript, javascript)');
    const early = await failure(service.documentSymbols({ languageId: 'python', pathToProject: dir, uri: `file://${dir}/a.py` }));
    expect([early.status, early.code]).toEqual([409, 'invalid_state']);
    expect(early.message).toContain(`no python language server is running for ${dir}`);
    expect((await failure(service.stop({ languageId: 'typescript', pathToProject: dir }))).code).toBe('invalid_state');
  });

  it('says which server is missing from the image, and refuses a project that is not a directory', async () => {
    const missing = await failure(lsp({ programs: { python: { file: '/nonexistent/pylsp', args: [] } } }).start({ languageId: 'python', pathToProject: dir }));
    expect([missing.status, missing.code]).toEqual([501, 'not_supported']);
    expect(missing.message).toContain('/nonexistent/pylsp');
    service!.close();
    const notDir = await failure(lsp({ programs: { python: { file: '/bin/sh', args: ['-c', 'sleep 30'] } } }).start({ languageId: 'python', pathToProject: 'no/such/dir' }));
    expect(notDir.message).toBe(`pathToProject: not a directory in the sandbox: ${dir}/no/such/dir`);
  });

  it('reports a server that dies during start with how it ended and what it said', async () => {
    const service = lsp({ programs: { python: { file: '/bin/sh', args: ['-c', 'echo "no module named jedi" >&2; exit 3'] } } });
    const died = await failure(service.start({ languageId: 'python', pathToProject: dir }));
    expect([died.status, died.code]).toEqual([409, 'invalid_state']);
    expect(died.message).toMatch(/^the python language server could not be started: .* has exited \(exit code 3\); its last output: no module named jedi/);
  });

  it('bounds a start that never answers, and kills what it started', async () => {
    const service = lsp({ startTimeoutMs: 300, programs: { typescript: { file: '/bin/sh', args: ['-c', 'echo $$ > pid; exec sleep 30'] } } });
    const slow = await failure(service.start({ languageId: 'typescript', pathToProject: dir }));
    expect([slow.status, slow.code]).toEqual([504, 'timeout']);
    expect(slow.message).toContain('did not answer initialize within 0.3 s');
    const { readFileSync } = await import('node:fs');
    const pid = Number(readFileSync(join(dir, 'pid'), 'utf8'));
    // Killed with its process group; bounded wait for the kernel to reap it.
    let alive = true;
    for (let i = 0; i < 50 && alive; i++) {
      try {
        process.kill(pid, 0);
        await new Promise((resolve) => setTimeout(resolve, 100));
      } catch {
        alive = false;
      }
    }
    expect(alive).toBe(false);
  });
});

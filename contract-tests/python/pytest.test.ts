// The Python contract tests (pytest, in this folder) inside `npm test`: one real Nestbox server
// serves both compatibility layers, the real PyPI SDKs (scripts/install-python-sdks.sh, pinned
// in requirements.txt) are pointed at it through their own environment variables, and every
// pytest case is reported here as a vitest case of its own, with pytest's output on failure.
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, type TestServer } from '../../test/harness.js';
import { projectPath } from '../../src/paths.js';

const SUITE_DIR = projectPath('contract-tests/python');
/** The whole pytest run, bounded (each case also has pytest-timeout's limit, pytest.ini). */
const RUN_LIMIT_MS = 15 * 60_000;

interface CaseResult {
  nodeid: string;
  outcome: 'passed' | 'failed' | 'skipped';
  duration: number;
  details: string[];
}

// Builds the virtualenv if it is missing or stale (a no-op otherwise) and names it.
const venv = execFileSync('bash', [projectPath('scripts/install-python-sdks.sh')], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] }).trim();
const python = path.join(venv, 'bin/python');

/** Only what the SDKs need: nothing from the machine's own E2B_* / DAYTONA_* may leak in. */
function pytestEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: process.env.HOME, LANG: 'C.UTF-8', PYTHONDONTWRITEBYTECODE: '1', PYTHONUNBUFFERED: '1' };
  return { ...env, ...extra };
}

// The cases, known before anything runs so each gets its own vitest case. Collection needs the
// environment the suite checks for, though no server yet.
const placeholders = { E2B_API_KEY: 'x', E2B_API_URL: 'http://127.0.0.1:9', E2B_SANDBOX_URL: 'http://127.0.0.1:9', DAYTONA_API_KEY: 'x', DAYTONA_API_URL: 'http://127.0.0.1:9' };
const collected = execFileSync(python, ['-m', 'pytest', '--collect-only', '-q'], { cwd: SUITE_DIR, env: pytestEnv(placeholders), encoding: 'utf8' });
const caseIds = collected.split('\n').filter((line) => line.includes('::'));

let server: TestServer;
const results = new Map<string, CaseResult>();
let run: { code: number | null; signal: string | null; output: string; timedOut: boolean };

beforeAll(async () => {
  // Usage samples every 2 s, so metrics tests (test_e2b_metrics.py) see them move within seconds.
  // An SSH gateway on a free port for test_daytona_ssh.py (the harness turns it off by default).
  const sshPort = await new Promise<number>((resolve) => {
    const probe = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as net.AddressInfo;
      probe.close(() => resolve(port));
    });
  });
  server = await startTestServer({ env: { NESTBOX_USAGE_SAMPLE_SECONDS: '2', NESTBOX_SSH_PORT: String(sshPort) } });
  const reportDir = mkdtempSync(path.join(tmpdir(), 'nbx-pytest-'));
  const report = path.join(reportDir, 'report.jsonl');
  try {
    run = await new Promise((resolve, reject) => {
      const child = spawn(python, ['-m', 'pytest', '-q'], {
        cwd: SUITE_DIR,
        env: pytestEnv({
          E2B_API_KEY: server.apiKey,
          E2B_API_URL: `${server.url}/e2b`,
          E2B_SANDBOX_URL: server.url,
          // Volume contents (test_volumes.py): the SDK's content base URL.
          E2B_VOLUME_API_URL: `${server.url}/e2b`,
          DAYTONA_API_KEY: server.apiKey,
          DAYTONA_API_URL: `${server.url}/daytona/api`,
          NESTBOX_PYTEST_REPORT: report,
        }),
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let output = '';
      child.stdout.on('data', (d) => (output += String(d)));
      child.stderr.on('data', (d) => (output += String(d)));
      let timedOut = false;
      const timer = setTimeout(() => {
        timedOut = true;
        child.kill('SIGKILL');
      }, RUN_LIMIT_MS);
      child.on('error', reject);
      child.on('close', (code, signal) => {
        clearTimeout(timer);
        resolve({ code, signal, output, timedOut });
      });
    });
    for (const line of readFileSync(report, 'utf8').split('\n').filter(Boolean)) {
      const r = JSON.parse(line) as CaseResult;
      results.set(r.nodeid, r);
    }
  } finally {
    rmSync(reportDir, { recursive: true, force: true });
  }
}, RUN_LIMIT_MS + 120_000);

afterAll(async () => {
  await server?.close();
});

describe('python SDK contract tests (pytest)', () => {
  it('collects the suite', () => {
    expect(caseIds.length).toBeGreaterThan(0);
  });

  for (const id of caseIds) {
    it(id, () => {
      const r = results.get(id);
      if (!r) throw new Error(`pytest reported nothing for ${id} (exit ${run.code ?? run.signal}${run.timedOut ? ', killed at the run limit' : ''}):\n${run.output.slice(-6000)}`);
      // A skipped case is a defect here, as in the TypeScript suites.
      if (r.outcome !== 'passed') throw new Error(`${id} ${r.outcome}:\n${r.details.join('\n')}`.slice(0, 20_000));
    });
  }

  it('pytest exits 0 having run every collected case', () => {
    expect(results.size, run.output.slice(-6000)).toBe(caseIds.length);
    expect(run.code, run.output.slice(-6000)).toBe(0);
  });
});

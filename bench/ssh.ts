// SSH exec round trip (issue 19) beside the native API's exec, on one server of its own:
//   - `ssh -o ControlMaster=no … true` (Debian's OpenSSH, a new connection each time: TCP,
//     key exchange, token login, session, exec, exit status);
//   - the same over one OpenSSH master connection (ControlMaster/ControlPath), so only the
//     session and exec are paid;
//   - ssh2's client, exec `true` on one connection;
//   - the native API: POST /sandboxes/{id}/commands {argv: ["true"]} (keep-alive HTTP).
// Medians (and p95) of `runs` each, after one warm-up. No thresholds.
import { execFile, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import ssh2 from 'ssh2';
import { loadConfig } from '../src/config.js';
import { createLogger } from '../src/logger.js';
import { startServer } from '../src/server.js';
import { generateApiKey } from '../core/services/auth.js';
import { removeTree } from '../host/util/fs.js';
import { call, ms, quantile, timed } from './measure.js';

export interface SshBenchOptions {
  runs: number;
  imagesDir: string;
  postgres?: string;
}

const run = promisify(execFile);

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

async function sample(runs: number, fn: () => Promise<unknown>): Promise<number[]> {
  await fn();
  const out: number[] = [];
  for (let i = 0; i < runs; i++) out.push((await timed(fn))[0]);
  return out;
}

const line = (name: string, xs: number[]) => `${name.padEnd(52)} median ${ms(quantile(xs, 0.5))}, p95 ${ms(quantile(xs, 0.95))}`;

export async function benchSsh(o: SshBenchOptions): Promise<void> {
  const runs = Math.max(1, o.runs);
  const dataDir = mkdtempSync('/tmp/nbx-bench-ssh-');
  const scratch = mkdtempSync('/tmp/nbx-bench-ssh-client-');
  const key = generateApiKey();
  const sshPort = await freePort();
  const config = loadConfig({
    NESTBOX_PORT: '0',
    NESTBOX_DATA_DIR: dataDir,
    NESTBOX_IMAGES_DIR: o.imagesDir,
    NESTBOX_BOOTSTRAP_API_KEY: key,
    NESTBOX_WARM_POOL_SIZE: '0', // no warm pool: its refills would run beside what is measured
    NESTBOX_SSH_PORT: String(sshPort),
    NESTBOX_SLOT_POOL_SIZE: '1',
    NESTBOX_REFLINK_STORE: 'off',
    NESTBOX_RATE_LIMIT_KEY_PER_SECOND: '0',
    NESTBOX_RATE_LIMIT_ORG_PER_SECOND: '0',
    ...(o.postgres ? { NESTBOX_DATABASE_URL: o.postgres } : {}),
  });
  const logs: string[] = [];
  const server = await startServer(config, createLogger({ level: config.logLevel }, { write: (l) => logs.push(l.trimEnd()) }));
  const base = `${server.url}/api/v1`;
  let sandboxId: string | undefined;
  let master: ReturnType<typeof spawn> | undefined;
  try {
    const deadline = Date.now() + 120_000;
    while (JSON.parse((await call(base, key, 'GET', '/health')).body).hostsAvailable < 1) {
      if (Date.now() > deadline) throw new Error(`ssh bench: no host agent registered:\n${logs.slice(-30).join('\n')}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    const created = await call(base, key, 'POST', '/sandboxes', { timeoutSeconds: 0, egress: { mode: 'deny-all' } });
    if (created.status !== 201) throw new Error(`ssh bench: create failed: ${created.body}`);
    sandboxId = JSON.parse(created.body).id as string;
    const access = await call(base, key, 'POST', `/sandboxes/${sandboxId}/ssh-access`, { expiresInMinutes: 60 });
    if (access.status !== 201) throw new Error(`ssh bench: ssh access failed: ${access.body}`);
    const token = JSON.parse(access.body).token as string;
    const common = ['-o', 'StrictHostKeyChecking=no', '-o', 'UserKnownHostsFile=/dev/null', '-o', 'BatchMode=yes', '-o', 'LogLevel=ERROR', '-p', String(sshPort)];
    const target = `${token}@127.0.0.1`;

    const native = await sample(runs, async () => {
      const r = await call(base, key, 'POST', `/sandboxes/${sandboxId}/commands`, { argv: ['true'] });
      if (r.status !== 200 || JSON.parse(r.body).exitCode !== 0) throw new Error(`ssh bench: native exec failed: ${r.body}`);
    });
    const fresh = await sample(runs, () => run('ssh', [...common, '-o', 'ControlMaster=no', '-o', 'ControlPath=none', target, 'true']));

    const sock = join(scratch, 'master.sock');
    master = spawn('ssh', [...common, '-o', 'ControlMaster=yes', '-o', `ControlPath=${sock}`, '-N', target], { stdio: 'ignore' });
    const until = Date.now() + 30_000;
    while ((await run('ssh', [...common, '-o', `ControlPath=${sock}`, '-O', 'check', target]).then(() => true, () => false)) === false) {
      if (Date.now() > until) throw new Error('ssh bench: the OpenSSH master connection did not come up');
      await new Promise((r) => setTimeout(r, 100));
    }
    const muxed = await sample(runs, () => run('ssh', [...common, '-o', `ControlPath=${sock}`, target, 'true']));

    const client = new ssh2.Client();
    await new Promise<void>((resolve, reject) => {
      client.once('ready', () => resolve()).once('error', reject);
      client.connect({ host: '127.0.0.1', port: sshPort, username: token, tryKeyboard: false });
    });
    const ssh2Exec = () =>
      new Promise<void>((resolve, reject) => {
        client.exec('true', (err, stream) => {
          if (err) return reject(err);
          stream.on('close', (code: number) => (code === 0 ? resolve() : reject(new Error(`exit ${code}`)))).resume();
        });
      });
    const reused = await sample(runs, ssh2Exec);
    client.end();

    console.log(`SSH exec round trip vs the API exec (\`true\`, n=${runs} each, this machine):`);
    console.log(line('native API POST /commands {argv:[true]}', native));
    console.log(line('ssh … true, ControlMaster=no (new connection)', fresh));
    console.log(line('ssh … true over a ControlMaster connection', muxed));
    console.log(line('ssh2 client exec true on one connection', reused));
    console.log(`→ new SSH connection / API exec ${(quantile(fresh, 0.5) / quantile(native, 0.5)).toFixed(2)}×; reused connection (ssh2) / API exec ${(quantile(reused, 0.5) / quantile(native, 0.5)).toFixed(2)}×`);
  } finally {
    if (master && master.exitCode === null) master.kill('SIGTERM');
    if (sandboxId) await call(base, key, 'DELETE', `/sandboxes/${sandboxId}`).catch(() => undefined);
    await server.close();
    await removeTree(dataDir).catch(() => rmSync(dataDir, { recursive: true, force: true }));
    rmSync(scratch, { recursive: true, force: true });
  }
}

// What a host-to-host move of a stopped sandbox holding 1 GiB costs (issue 16), beside a plain
// `cp` of the same number of bytes on the same machine. One server with its local host agent and
// one extra `nestbox host-agent` process (its own data dir and id) on loopback; the sandbox moves
// there and back, each move timed end to end through the API (claim, the receiving agent pulling
// the disk image from the source as a sparse tar stream, commit, the source copy destroyed). The
// baseline copies a 1 GiB file of random bytes with `cp --sparse=always` in a scratch dir on the
// same file system as the data dirs. Medians of `runs`; the ratio is printed. No thresholds.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { loadConfig } from '../src/config.js';
import { createLogger } from '../src/logger.js';
import { startServer } from '../src/server.js';
import { CLI_ENTRY } from '../src/paths.js';
import { generateApiKey } from '../core/services/auth.js';
import { removeTree } from '../host/util/fs.js';
import { deriveHostSecret } from '../core/services/hosts.js';
import { call, ms, quantile, timed } from './measure.js';

export interface HostTransferBenchOptions {
  /** Moves timed (alternating directions), and baseline copies. */
  runs: number;
  /** Bytes of random data in the sandbox (default 1 GiB). */
  bytes: number;
  imagesDir: string;
  postgres?: string;
}

const PEER = 'bench-transfer-peer';

export async function benchHostTransfer(o: HostTransferBenchOptions): Promise<void> {
  const runs = Math.max(1, Math.min(10, o.runs));
  const dataDir = mkdtempSync('/tmp/nbx-bench-transfer-');
  const peerDir = mkdtempSync('/tmp/nbx-bench-transfer-peer-');
  const master = randomBytes(32).toString('base64url');
  const key = generateApiKey();
  const config = loadConfig({
    NESTBOX_PORT: '0',
    NESTBOX_SSH_PORT: '0',
    NESTBOX_DATA_DIR: dataDir,
    NESTBOX_IMAGES_DIR: o.imagesDir,
    NESTBOX_BOOTSTRAP_API_KEY: key,
    NESTBOX_WARM_POOL_SIZE: '0', // no warm pool: its refills would run beside what is measured
    NESTBOX_HOST_SECRET: master,
    NESTBOX_HOST_ID: 'bench-transfer-local',
    NESTBOX_SLOT_POOL_SIZE: '1',
    NESTBOX_REFLINK_STORE: 'off',
    ...(o.postgres ? { NESTBOX_DATABASE_URL: o.postgres } : {}),
  });
  const logs: string[] = [];
  const server = await startServer(config, createLogger({ level: config.logLevel }, { write: (line) => logs.push(line.trimEnd()) }));
  const base = `${server.url}/api/v1`;
  let peer: ChildProcess | undefined;
  let sandboxId: string | undefined;
  try {
    peer = spawn(process.execPath, [CLI_ENTRY(), 'host-agent'], {
      stdio: 'ignore',
      env: {
        PATH: process.env.PATH ?? '',
        HOME: process.env.HOME ?? '/root',
        NESTBOX_DATA_DIR: peerDir,
        NESTBOX_IMAGES_DIR: o.imagesDir,
        NESTBOX_HOST_ID: PEER,
        NESTBOX_HOST_AGENT_PORT: '0',
        NESTBOX_CONTROL_PLANE_URL: server.url,
        NESTBOX_HOST_AGENT_SECRET: deriveHostSecret(master, PEER),
        NESTBOX_HEARTBEAT_INTERVAL_MS: '500',
        NESTBOX_REFLINK_STORE: 'off',
        NESTBOX_CODE_INTERPRETER_IMAGE: 'on-demand',
        NESTBOX_SLOT_POOL_SIZE: '0',
        NESTBOX_LOG_LEVEL: 'warn',
      },
    });
    const deadline = Date.now() + 120_000;
    while (JSON.parse((await call(base, key, 'GET', '/health')).body).hostsAvailable < 2) {
      if (Date.now() > deadline) throw new Error(`host transfer bench: the peer host agent did not register:\n${logs.slice(-30).join('\n')}`);
      await new Promise((r) => setTimeout(r, 200));
    }
    const diskGiB = Math.ceil(o.bytes / 2 ** 30) + 1;
    const created = await call(base, key, 'POST', '/sandboxes', { timeoutSeconds: 0, diskGiB, egress: { mode: 'deny-all' }, placement: { hostId: 'bench-transfer-local' } });
    if (created.status !== 201) throw new Error(`host transfer bench: create failed: ${created.body}`);
    sandboxId = JSON.parse(created.body).id as string;
    const fill = await call(base, key, 'POST', `/sandboxes/${sandboxId}/commands`, { cmd: `head -c ${o.bytes} /dev/urandom > /root/data && sync`, timeoutMs: 600_000 });
    if (fill.status !== 200 || JSON.parse(fill.body).exitCode !== 0) throw new Error(`host transfer bench: filling the sandbox failed: ${fill.body}`);
    const stopped = await call(base, key, 'POST', `/sandboxes/${sandboxId}/stop`);
    if (stopped.status !== 200) throw new Error(`host transfer bench: stop failed: ${stopped.body}`);
    const moves: number[] = [];
    for (let i = 0; i < runs; i++) {
      const to = i % 2 === 0 ? PEER : 'bench-transfer-local';
      const [t, res] = await timed(() => call(base, key, 'POST', `/sandboxes/${sandboxId}/move`, { hostId: to }));
      if (res.status !== 200) throw new Error(`host transfer bench: move to ${to} failed: ${res.body}`);
      moves.push(t);
    }
    // The same bytes copied by `cp` on the same file system (/tmp, where both data dirs are).
    const scratch = mkdtempSync('/tmp/nbx-bench-transfer-cp-');
    const copies: number[] = [];
    try {
      execFileSync('sh', ['-c', `head -c ${o.bytes} /dev/urandom > ${join(scratch, 'src')} && sync`]);
      for (let i = 0; i < runs; i++) {
        const [t] = await timed(async () => execFileSync('cp', ['--sparse=always', join(scratch, 'src'), join(scratch, `copy-${i}`)]));
        copies.push(t);
        rmSync(join(scratch, `copy-${i}`), { force: true });
      }
    } finally {
      rmSync(scratch, { recursive: true, force: true });
    }
    const move = quantile(moves, 0.5);
    const cp = quantile(copies, 0.5);
    const mib = o.bytes / 2 ** 20;
    console.log(`host-to-host move of a stopped sandbox holding ${mib.toFixed(0)} MiB (n=${runs}): median ${ms(move)} (${(mib / (move / 1000)).toFixed(0)} MiB/s); plain cp of the same bytes: median ${ms(cp)} (${(mib / (cp / 1000)).toFixed(0)} MiB/s) → move/cp ${(move / cp).toFixed(2)}×`);
  } finally {
    if (sandboxId) await call(base, key, 'DELETE', `/sandboxes/${sandboxId}`).catch(() => undefined);
    await server.close();
    if (peer && peer.exitCode === null) {
      const exited = new Promise((r) => peer!.once('exit', r));
      peer.kill('SIGTERM');
      await exited;
    }
    // Disk images are loop-mounted under the data dirs: removeTree unmounts them first.
    for (const dir of [dataDir, peerDir]) await removeTree(dir).catch(() => rmSync(dir, { recursive: true, force: true }));
  }
}

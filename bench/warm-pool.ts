// Warm-pool create (core/services/warm-pool.ts) beside the cold create and the raw floor, all in
// the same run: the floor is what any create on this machine must at least do — new namespaces,
// an overlay root over the same base image, `chroot … /bin/true` — with none of Nestbox in it.
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { RunningServer } from '../src/server.js';
import { call, ms, quantile, timed } from './measure.js';

/**
 * The raw floor of a create, `runs` times (ms each): `unshare` of mount, UTS, IPC, network and
 * PID namespaces, an overlay mount (lower: the base image's rootfs, upper and work: fresh
 * directories) and `chroot <merged> /bin/true`, through one `sh -c` inside the namespaces. The
 * directories are made before the clock starts and removed after it stops.
 */
export async function rawCreateFloor(baseRootfs: string, runs: number): Promise<number[]> {
  const scratch = mkdtempSync('/tmp/nbx-floor-');
  const times: number[] = [];
  try {
    for (let i = 0; i < runs; i++) {
      const dir = join(scratch, String(i));
      for (const d of ['upper', 'work', 'merged']) mkdirSync(join(dir, d), { recursive: true });
      const script = `mount -t overlay overlay -o lowerdir=${baseRootfs},upperdir=${dir}/upper,workdir=${dir}/work ${dir}/merged && exec chroot ${dir}/merged /bin/true`;
      const [t, code] = await timed(() => new Promise<number | null>((resolve, reject) => {
        const child = spawn('unshare', ['--mount', '--uts', '--ipc', '--net', '--pid', '--fork', '--propagation', 'private', 'sh', '-c', script], { stdio: ['ignore', 'ignore', 'inherit'] });
        child.on('error', reject);
        child.on('exit', resolve);
      }));
      if (code !== 0) throw new Error(`raw create floor: unshare … chroot /bin/true exited ${code}`);
      times.push(t);
      // The mount lived in the namespace that just ended, so the directories are plain now.
      rmSync(dir, { recursive: true, force: true });
    }
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
  return times;
}

/**
 * `creates` creates of the pooled (default) image and size, each answered by a ready member
 * (the pool is refilled to its target before each, outside the clock), next to the cold
 * creates measured before (`coldTimes`) and the raw floor measured here.
 */
export async function benchWarmPool(o: { server: RunningServer; base: string; key: string; creates: number; coldTimes: number[]; baseRootfs: string; track: (id: string) => void }): Promise<void> {
  const pool = o.server.services.warmPool;
  if (!pool.enabled) {
    console.log('warm-pool create: skipped (the server keeps no warm pool: NESTBOX_WARM_POOL_SIZE=0)');
    return;
  }
  pool.start();
  const readyCount = async () => ((await pool.levels()).reduce((n, k) => n + k.ready, 0));
  const target = async () => ((await pool.levels()).reduce((n, k) => n + k.target, 0));
  const waitFull = async () => {
    const deadline = Date.now() + 120_000;
    while ((await readyCount()) < (await target())) {
      if (Date.now() > deadline) throw new Error('the warm pool did not fill within 120 s');
      await new Promise((r) => setTimeout(r, 50));
    }
  };
  const warm: number[] = [];
  const hitsBefore = pool.hits;
  try {
    for (let i = 0; i < o.creates; i++) {
      await waitFull();
      const [t, res] = await timed(() => call(o.base, o.key, 'POST', '/sandboxes', { timeoutSeconds: 0 }));
      if (res.status !== 201) throw new Error(`warm create failed: ${res.body}`);
      o.track(JSON.parse(res.body).id);
      warm.push(t);
    }
  } finally {
    await pool.stop();
    await pool.drain();
  }
  const hits = pool.hits - hitsBefore;
  const floor = await rawCreateFloor(o.baseRootfs, o.creates);
  const [w50, w95, c50, c95, f50, f95] = [quantile(warm, 0.5), quantile(warm, 0.95), quantile(o.coldTimes, 0.5), quantile(o.coldTimes, 0.95), quantile(floor, 0.5), quantile(floor, 0.95)];
  console.log(`warm-pool create → running (n=${o.creates}, ${hits} answered from the pool): p50 ${ms(w50)}, p95 ${ms(w95)} → ×${(w50 / f50).toFixed(1)} the raw floor (goal ≤ 1.5×), ×${(c50 / w50).toFixed(1)} faster than cold`);
  console.log(`  cold create p50 ${ms(c50)}, p95 ${ms(c95)} → ×${(c50 / f50).toFixed(1)} the raw floor (goal ≤ 4×)`);
  console.log(`  raw floor (unshare mount/uts/ipc/net/pid + overlay over the base image + chroot /bin/true, n=${o.creates}): p50 ${ms(f50)}, p95 ${ms(f95)}`);
}

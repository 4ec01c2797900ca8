// A sandbox's resource use as its workload sees it: CPUs and their use over 0.2 s, memory
// (capped by the sandbox's cgroup limit when that is lower than the machine's), and the disk of
// its root filesystem. Measured inside the sandbox by a short standard-library Python program
// run like any command, so it reads the workload's own /proc, cgroup and root filesystem (the
// guest agent's view of those can differ). Used by Toolbox.systemMetrics.
import { errors } from '../errors.js';
import type { ExecInput, ExecResult } from '../guest.js';

export interface SystemMetrics {
  cpuCount: number;
  /** Percent of all CPUs busy over the 0.2 s sample. */
  cpuUsedPct: number;
  /** Bytes: the machine's memory, or the sandbox's cgroup limit when lower. */
  memTotal: number;
  memUsed: number;
  memCache: number;
  /** Bytes of the root filesystem. */
  diskTotal: number;
  diskUsed: number;
}

const FIELDS = ['cpuCount', 'cpuUsedPct', 'memTotal', 'memUsed', 'memCache', 'diskTotal', 'diskUsed'] as const satisfies readonly (keyof SystemMetrics)[];

const SYSTEM_METRICS_SCRIPT = String.raw`
import json, os, time, shutil
def cpu():
    with open('/proc/stat') as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + (v[4] if len(v) > 4 else 0)
t1, i1 = cpu(); time.sleep(0.2); t2, i2 = cpu()
used = 0.0 if t2 == t1 else 100.0 * (1 - (i2 - i1) / (t2 - t1))
mem = {}
with open('/proc/meminfo') as f:
    for line in f:
        k, v = line.split(':', 1)
        mem[k] = int(v.split()[0]) * 1024
total = mem.get('MemTotal', 0)
for path in ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'):
    try:
        with open(path) as f:
            limit = f.read().strip()
        if limit.isdigit() and 0 < int(limit) < total:
            total = int(limit)
        break
    except OSError:
        pass
usedmem = max(0, mem.get('MemTotal', 0) - mem.get('MemAvailable', 0))
disk = shutil.disk_usage('/')
print(json.dumps({'cpuCount': os.cpu_count() or 0, 'cpuUsedPct': round(used, 2), 'memTotal': total, 'memUsed': min(usedmem, total), 'memCache': mem.get('Cached', 0), 'diskTotal': disk.total, 'diskUsed': disk.used}))
`;

/** The command that measures (prints one JSON object of SystemMetrics). */
export const SYSTEM_METRICS_COMMAND: ExecInput = { argv: ['python3', '-c', SYSTEM_METRICS_SCRIPT], timeoutMs: 10_000 };

/** The measurement's answer, checked: every field a finite number, else an internal error. */
export function parseSystemMetrics(r: ExecResult): SystemMetrics {
  if (r.exitCode !== 0) throw errors.internal(`reading metrics failed: ${r.stdout}${r.stderr}`.slice(0, 500));
  let value: unknown;
  try {
    value = JSON.parse(r.stdout);
  } catch {
    value = undefined;
  }
  const record = value && typeof value === 'object' ? (value as Record<string, unknown>) : {};
  const missing = FIELDS.filter((f) => typeof record[f] !== 'number' || !Number.isFinite(record[f]));
  if (missing.length) throw errors.internal(`reading metrics failed: unexpected output (${missing.join(', ')}): ${r.stdout}`.slice(0, 500));
  return value as SystemMetrics;
}

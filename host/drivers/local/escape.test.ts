// Escape tests: real sandboxes on the real kernel, attacked from inside as their own root.
// Each block pins one finding of issue 11 (fd leaks, user namespaces and keyrings, seccomp,
// the guest agent's protection from its workloads, host paths in mountinfo).
// Runs as root. The fd-leak test runs a host agent in a child process (the compiled driver in
// dist/, which `npm test` builds first) so that it can hand that process a descriptor without
// close-on-exec, exactly like a shell or supervisor would.
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { Readable } from 'node:stream';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../agent-protocol/client.js';
import type { SandboxSpec } from '../types.js';
import { Cgroups } from './cgroups.js';
import { LocalDriver } from './driver.js';
import { DEFAULT_ID_BASE, IDS_PER_SANDBOX } from './id-ranges.js';
import { AGENT_UID } from './spawn.js';
import { DEFAULT_WORKLOAD_OOM_SCORE_ADJ } from '../../guest-agent/workload.js';
import { sh, uniqueId } from './test-support.js';

const IMAGES_DIR = process.env.NESTBOX_TEST_IMAGES_DIR ?? '/var/tmp/nestbox-test-images';
const REPO = resolve(import.meta.dirname, '../../..');
const AGENT_BUNDLE = join(REPO, 'dist', 'guest-agent.mjs');
const COMPILED_DRIVER = join(REPO, 'dist', 'host', 'drivers', 'local', 'driver.js');
const isRoot = process.getuid?.() === 0;

function spec(id: string, overrides: Partial<SandboxSpec> = {}): SandboxSpec {
  return { id, image: 'default', cpu: 1, memoryMiB: 256, env: {}, ...overrides };
}


/** fd number → link target of every open descriptor of a host pid. */
function fdsOf(pid: number): Map<number, string> {
  const fds = new Map<number, string>();
  for (const entry of readdirSync(`/proc/${pid}/fd`)) {
    try {
      fds.set(Number(entry), readlinkSync(`/proc/${pid}/fd/${entry}`));
    } catch {
      // Closed meanwhile.
    }
  }
  return fds;
}

/** Host pids of every process of the sandbox (its cgroup subtree). */
async function sandboxPids(cgroups: Cgroups, ownerId: string, id: string): Promise<number[]> {
  return cgroups.pids(cgroups.groupFor(`nestbox/${ownerId}/${id}`));
}

/** The host pid of the sandbox's guest agent (the node process under tini). */
function agentPidOf(pids: number[]): number {
  const agent = pids.find((pid) => {
    try {
      const comm = readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
      return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes('guest-agent.mjs') && comm !== 'tini' && comm !== 'unshare';
    } catch {
      return false;
    }
  });
  if (!agent) throw new Error(`no guest agent among ${pids.join(', ')}`);
  return agent;
}

/** Python (inside a sandbox): the guest agent's pid, found by its command line. */
const AGENT_PID_PY = `def agent_pid():
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                argv = open("/proc/%s/cmdline" % p, "rb").read().split(b"\\0")
            except OSError:
                continue
            if not argv[0].endswith(b"/tini") and any(a.endswith(b"guest-agent.mjs") for a in argv):
                return int(p)
`;

describe.skipIf(!isRoot)('escape tests (real sandboxes)', () => {
  const dataDir = mkdtempSync('/tmp/nbxe-');
  const ownerId = uniqueId('esc');
  let cgroups: Cgroups;
  let driver: LocalDriver;
  const created = new Set<string>();

  beforeAll(async () => {
    if (!existsSync(AGENT_BUNDLE) || !existsSync(COMPILED_DRIVER)) execFileSync('npm', ['run', 'build'], { cwd: REPO, stdio: 'inherit' });
    cgroups = await Cgroups.detect();
    driver = new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId, slotPoolSize: 0, watchIntervalMs: 500 });
    await driver.init();
  }, 600_000);

  afterAll(async () => {
    for (const id of created) await driver.destroy(id).catch(() => {});
    await driver.close();
    await cgroups.remove(cgroups.groupFor(`nestbox/${ownerId}`)).catch(() => {});
    rmSync(dataDir, { recursive: true, force: true });
  }, 120_000);

  describe('finding 8: no host descriptor reaches the sandbox', () => {
    it('a descriptor the host agent inherited without close-on-exec is in no sandbox process; workloads hold only stdio', async () => {
      // A host agent in its own process that inherited fd 100 without close-on-exec, as from a
      // shell's `exec 100<file` (Node itself marks a few low descriptors close-on-exec at start,
      // but not these).
      const childDataDir = mkdtempSync('/tmp/nbxf-');
      const marker = join(childDataDir, 'inherited-marker');
      writeFileSync(marker, 'host only\n');
      const childOwner = uniqueId('escfd');
      const id = uniqueId('fd');
      const script = `
        import { LocalDriver } from ${JSON.stringify(COMPILED_DRIVER)};
        const driver = new LocalDriver({ dataDir: ${JSON.stringify(childDataDir)}, imagesDir: ${JSON.stringify(IMAGES_DIR)}, guestAgentBundle: ${JSON.stringify(AGENT_BUNDLE)}, ownerId: ${JSON.stringify(childOwner)}, slotPoolSize: 0 });
        await driver.init();
        const runtime = await driver.create({ id: ${JSON.stringify(id)}, image: 'default', cpu: 1, memoryMiB: 256, env: {} });
        process.stdout.write(JSON.stringify(runtime) + '\\n');
        process.stdin.resume();
        process.stdin.on('end', async () => { await driver.destroy(${JSON.stringify(id)}); await driver.close(); process.exit(0); });
      `;
      const host = spawn('/bin/bash', ['-c', 'exec 100<"$0"; exec "$1" --input-type=module -e "$2"', marker, process.execPath, script], { stdio: ['pipe', 'pipe', 'inherit'] });
      try {
        const line = await new Promise<string>((resolveLine, reject) => {
          const lines = createInterface({ input: host.stdout! });
          lines.once('line', resolveLine);
          host.once('exit', (code) => reject(new Error(`host agent child exited (${code}) before the sandbox ran`)));
        });
        const runtime = JSON.parse(line) as { agentSocket: string; pid: number };
        const leaked = fdsOf(host.pid!).get(100);
        expect(leaked).toBe(marker);

        const pids = [runtime.pid, ...(await sandboxPids(cgroups, childOwner, id))];
        expect(pids.length).toBeGreaterThan(2);
        for (const pid of pids) {
          const holding = [...fdsOf(pid)].filter(([, target]) => target === leaked);
          expect(holding, `process ${pid} (${readFileSync(`/proc/${pid}/comm`, 'utf8').trim()}) holds the host's descriptor`).toEqual([]);
        }
        // tini (which passes them on to the agent): stdio, the agent's listening socket, the
        // drained end of the proof-key channel (fd 3: the agent read the key and closed its copy)
        // and the workload cgroup's procs files, nothing else.
        const tini = pids.find((pid) => readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'tini')!;
        const tiniFdMap = [...fdsOf(tini)].filter(([fd]) => fd > 2);
        const tiniFds = tiniFdMap.map(([, target]) => target);
        expect(tiniFds.filter((target) => target.startsWith('socket:'))).toHaveLength(2);
        const keyChannel = tiniFdMap.find(([fd]) => fd === 3)?.[1];
        expect(keyChannel).toMatch(/^socket:/);
        // The agent itself no longer holds the key channel (its fd 3 may since have been reused).
        const agentPid = pids.find((pid) => readFileSync(`/proc/${pid}/cmdline`, 'utf8').startsWith('/.nestbox/lib/host/ld.so\0'))!;
        expect(agentPid).toBeDefined();
        expect([...fdsOf(agentPid).values()]).not.toContain(keyChannel);
        // The workloads' user namespace (nestbox-seccomp --agent-uid), for nestbox-enter.
        const namespaces = tiniFds.filter((target) => target.startsWith('user:'));
        expect(namespaces).toHaveLength(1);
        // (shown relative to their cgroup file system: the sandbox's root does not contain them)
        const others = tiniFds.filter((target) => !target.startsWith('socket:') && !target.startsWith('user:'));
        expect(others).toHaveLength(cgroups.procsFiles(cgroups.groupFor(`nestbox/${childOwner}/${id}/work`)).length);
        for (const target of others) expect(target).toMatch(new RegExp(`/nestbox/${childOwner}/${id}/work/cgroup\\.procs$`));
        // A workload: stdio and the directory `ls` itself opened, nothing else.
        const listing = await sh(runtime.agentSocket, 'ls -l /proc/self/fd');
        const links = Object.fromEntries([...listing.stdout.matchAll(/ (\d+) -> (.+)$/gm)].map((match) => [Number(match[1]), match[2]]));
        expect(Object.keys(links).map(Number).sort((a, b) => a - b)).toEqual([0, 1, 2, 3]);
        expect(links[3]).toMatch(/^\/proc\/\d+\/fd$/);
      } finally {
        host.stdin!.end();
        await new Promise((resolveExit) => {
          if (host.exitCode !== null) resolveExit(undefined);
          else host.once('exit', resolveExit);
          setTimeout(() => host.kill('SIGKILL'), 60_000).unref();
        });
        await cgroups.remove(cgroups.groupFor(`nestbox/${childOwner}`)).catch(() => {});
        rmSync(childDataDir, { recursive: true, force: true });
      }
    }, 180_000);
  });

  describe('finding 3: a user namespace and a seccomp profile per sandbox', () => {
    it('root inside is an unprivileged host range of its own; image files are root-owned inside, disk ids stay unshifted', async () => {
      const [a, b] = [uniqueId('usa'), uniqueId('usb')];
      created.add(a).add(b);
      const [first, second] = await Promise.all([driver.create(spec(a, { egress: { mode: 'deny-all' } })), driver.create(spec(b, { egress: { mode: 'deny-all' } }))]);
      // The sandbox's namespace, the agent's (read from the host: a workload sees its own, below it).
      const mapOf = async (id: string) => {
        const agent = agentPidOf(await sandboxPids(cgroups, ownerId, id));
        return ['uid_map', 'gid_map'].map((file) => readFileSync(`/proc/${agent}/${file}`, 'utf8').trim().split(/\s+/).map(Number));
      };
      const [mapA, mapB] = [await mapOf(a), await mapOf(b)];
      for (const map of [mapA, mapB]) {
        expect(map).toHaveLength(2);
        for (const [inside, outside, count] of map) {
          expect(inside).toBe(0);
          expect(outside).toBeGreaterThanOrEqual(DEFAULT_ID_BASE);
          expect(count).toBe(IDS_PER_SANDBOX);
        }
      }
      // One range each: two sandboxes never share a host uid.
      expect(Math.abs(mapA[0][1] - mapB[0][1])).toBeGreaterThanOrEqual(IDS_PER_SANDBOX);
      // Seen from the host, the agent runs in that unprivileged range: real and saved uid the
      // range's last id (the agent's own), effective and file-system uid its root.
      const agent = agentPidOf(await sandboxPids(cgroups, ownerId, a));
      const [root, own] = [mapA[0][1], mapA[0][1] + AGENT_UID];
      expect(readFileSync(`/proc/${agent}/status`, 'utf8')).toMatch(new RegExp(`^Uid:\\s+${own}\\s+${root}\\s+${own}\\s+${root}$`, 'm'));
      // Workloads: the same ids as the sandbox's, all but the agent's.
      expect((await sh(first.agentSocket!, 'cat /proc/self/uid_map /proc/self/gid_map')).stdout.trim().split('\n').map((line) => line.trim().split(/\s+/).map(Number))).toEqual([
        [0, 0, AGENT_UID],
        [0, 0, AGENT_UID + 1],
      ]);

      const owners = await sh(first.agentSocket!, 'stat -c "%U:%G %n" /etc/passwd /usr/bin /root /dev/null /dev/shm; id -u; touch /root/by-root; mkdir /home/u1; chown 1000:1000 /home/u1; echo ok');
      expect(owners.stdout).toBe('root:root /etc/passwd\nroot:root /usr/bin\nroot:root /root\nroot:root /dev/null\nroot:root /dev/shm\n0\nok\n');
      const client = new AgentClient(first.agentSocket!);
      await client.writeFile('/root/uploaded.txt', Readable.from([Buffer.from('up')]));
      client.close();
      expect((await sh(first.agentSocket!, 'stat -c "%u:%g" /root/uploaded.txt')).stdout).toBe('0:0\n');
      const upper = join(dataDir, 'sandboxes', a, 'fs', 'upper');
      for (const [path, uid] of [['root/by-root', 0], ['root/uploaded.txt', 0], ['home/u1', 1000]] as const) expect(statSync(join(upper, path)).uid, path).toBe(uid);
    }, 120_000);

    it('programs keep working: setuid drops (su, apt\'s _apt sandbox), apt failing only on the network, git, python, node', async () => {
      const id = uniqueId('prg');
      created.add(id);
      const runtime = await driver.create(spec(id, { egress: { mode: 'deny-all' } }));
      const socket = runtime.agentSocket!;
      expect((await sh(socket, 'su -s /bin/sh _apt -c "id -u; id -g"')).stdout).toBe('42\n65534\n');
      const apt = await sh(socket, 'timeout 60 apt-get update 2>&1; ls -ldn /var/lib/apt/lists/auxfiles', 90_000);
      expect(apt.stdout).toMatch(/Temporary failure resolving|Could not resolve|Failed to fetch/);
      expect(apt.stdout).not.toMatch(/seteuid|setgroups|Permission denied|Operation not permitted/);
      // apt's download sandbox ran as _apt (uid 42) and owns what it made.
      expect(apt.stdout).toMatch(/drwx\S*\s+\d+\s+42\s+0\s/);
      const tools = await sh(socket, 'cd /tmp && git init -q r && cd r && git -c user.email=a@b -c user.name=n commit -q --allow-empty -m x && git log --oneline | wc -l; python3 -c "print(6*7)"; /.nestbox/bin/node -e "console.log(process.getuid())"');
      expect(tools).toMatchObject({ stdout: '1\n42\n0\n', exitCode: 0 });
    }, 180_000);

    it('keyrings: the kernel keyring calls are denied in the sandbox, and a key the host holds is out of its reach', async () => {
      const id = uniqueId('key');
      created.add(id);
      const runtime = await driver.create(spec(id));
      // A key in the host's user keyring (KEY_SPEC_USER_KEYRING = -4), added by this test's root.
      const description = `nestbox-escape-${randomBytes(4).toString('hex')}`;
      const hostKey = execFileSync('python3', ['-c', `import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.syscall(248, b"user", b"${description}", b"host-secret", 11, -4))`], { encoding: 'utf8' }).trim();
      expect(Number(hostKey)).toBeGreaterThan(0);
      try {
        const probe = await sh(runtime.agentSocket!, `python3 -c '
import ctypes
l = ctypes.CDLL(None, use_errno=True)
def call(*args):
    r = l.syscall(*args)
    return (r, ctypes.get_errno() if r < 0 else 0)
print("add_key", *call(248, b"user", b"sandbox-key", b"x", 1, -3))
print("request_key", *call(249, b"user", b"${description}", None, 0))
print("keyctl_read", *call(250, 11, ${hostKey}, None, 0))
print("keyctl_search", *call(250, 10, -4, b"user", b"${description}", 0))
'; cat /proc/keys | wc -l`);
        expect(probe.stdout).toBe('add_key -1 1\nrequest_key -1 1\nkeyctl_read -1 1\nkeyctl_search -1 1\n0\n');
      } finally {
        execFileSync('python3', ['-c', `import ctypes; ctypes.CDLL(None).syscall(250, 3, ${hostKey})`]);
      }
    });

    it('seccomp: the profile is on every sandbox process and denies the dangerous calls', async () => {
      const id = uniqueId('sec');
      created.add(id);
      const runtime = await driver.create(spec(id));
      for (const pid of await sandboxPids(cgroups, ownerId, id)) {
        const status = readFileSync(`/proc/${pid}/status`, 'utf8');
        if (readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'unshare') continue; // the launcher, on the host side
        expect(status, `process ${pid}`).toMatch(/^Seccomp:\s+2$/m);
      }
      const denied = await sh(runtime.agentSocket!, `python3 -c '
import ctypes
l = ctypes.CDLL(None, use_errno=True)
for name, nr in [("bpf", 321), ("perf_event_open", 298), ("userfaultfd", 323), ("io_uring_setup", 425), ("keyctl", 250), ("kexec_load", 246), ("init_module", 175), ("finit_module", 313), ("open_by_handle_at", 304), ("unshare", 272), ("setns", 308), ("mount", 165), ("clone3", 435)]:
    r = l.syscall(nr, 0, 0, 0, 0, 0)
    print(name, r, ctypes.get_errno())
'; unshare -U true 2>/dev/null; echo "unshare -U: $?"; grep CapBnd /proc/self/status`);
      const lines = denied.stdout.trim().split('\n');
      for (const line of lines.slice(0, -3)) expect(line, line).toMatch(/ -1 1$/);
      expect(lines.at(-3)).toBe('clone3 -1 38');
      expect(lines.at(-2)).toBe('unshare -U: 1');
      const capBnd = BigInt(`0x${lines.at(-1)!.split(/\s+/)[1]}`);
      expect((capBnd >> 21n) & 1n, 'CAP_SYS_ADMIN').toBe(0n);
    });
  });


  describe('finding 7: a workload cannot take over its guest agent', () => {
    it('ptrace, pidfd_getfd and /proc of the agent and tini are refused; the program files are execute-only', async () => {
      const id = uniqueId('agt');
      created.add(id);
      const runtime = await driver.create(spec(id));
      const attack = await sh(runtime.agentSocket!, `python3 - <<'PY'
import ctypes, os
l = ctypes.CDLL(None, use_errno=True)
def call(*args):
    r = l.syscall(*args)
    return "%d/%d" % (r, ctypes.get_errno() if r < 0 else 0)
${AGENT_PID_PY}for name, pid in [("agent", agent_pid()), ("tini", 1)]:
    print(name, "ptrace_attach", call(101, 16, pid, 0, 0))
    print(name, "ptrace_seize", call(101, 0x4206, pid, 0, 0))
    pidfd = l.syscall(434, pid, 0)
    stolen = [fd for fd in range(0, 64) if l.syscall(438, pidfd, fd, 0) >= 0]
    print(name, "pidfd_getfd", "stolen" if stolen else "none")
    for entry in ["fd", "mem", "environ"]:
        try:
            if entry == "fd":
                os.listdir("/proc/%d/fd" % pid)
            else:
                open("/proc/%d/%s" % (pid, entry), "rb").read(1)
            print(name, entry, "readable")
        except OSError as error:
            print(name, entry, "refused")
PY
for program in bin/tini bin/nestbox-enter bin/nestbox-pty bin/nestbox-seccomp lib/host/ld.so; do head -c1 /.nestbox/$program >/dev/null 2>&1 && echo "$program readable" || echo "$program execute-only"; done`);
      expect(attack.stdout).toBe(
        ['agent', 'tini']
          .flatMap((name) => [`${name} ptrace_attach -1/1`, `${name} ptrace_seize -1/1`, `${name} pidfd_getfd none`, `${name} fd refused`, `${name} mem refused`, `${name} environ refused`])
          .concat(['bin/tini', 'bin/nestbox-enter', 'bin/nestbox-pty', 'bin/nestbox-seccomp', 'lib/host/ld.so'].map((program) => `${program} execute-only`))
          .join('\n') + '\n',
      );
      // The agent still answers: nothing above disturbed it.
      expect((await sh(runtime.agentSocket!, 'echo alive')).stdout).toBe('alive\n');
    });

    it('no workload, root or not, can signal the agent or tini; workloads still signal each other', async () => {
      const id = uniqueId('sig');
      created.add(id);
      const runtime = await driver.create(spec(id, { egress: { mode: 'deny-all' } }));
      const socket = runtime.agentSocket!;
      // Another workload of another user, started by a separate request (a detached process).
      const client = new AgentClient(socket);
      try {
        const started = await client.request({ method: 'POST', path: '/processes', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ argv: ['bash', '-c', 'exec -a nestbox-victim sleep 600'], user: '1000' }) });
        started.resume();
        expect(started.statusCode).toBeLessThan(300);
      } finally {
        client.close();
      }
      const attack = await sh(socket, `python3 - <<'PY'
import ctypes, os, signal, sys
l = ctypes.CDLL(None, use_errno=True)
${AGENT_PID_PY}def attempt(label, pid):
    for sig in [0, signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL]:
        try:
            os.kill(pid, sig)
            print(label, int(sig), "delivered")
        except OSError as error:
            print(label, int(sig), error.errno)
agent = agent_pid()
attempt("root agent", agent)
attempt("root tini", 1)
# The workloads' namespace holds no way back up, and the agent's uid does not exist in it.
fd = os.open("/proc/self/ns/user", os.O_RDONLY)
print("setns", l.setns(fd, 0x10000000), ctypes.get_errno())
try:
    os.setresuid(${AGENT_UID}, ${AGENT_UID}, ${AGENT_UID})
    print("become the agent's uid: yes")
except OSError as error:
    print("become the agent's uid:", error.errno)
sys.stdout.flush()
if os.fork() == 0:
    os.setgid(1000); os.setuid(1000)
    attempt("user agent", agent)
    sys.stdout.flush()
    os._exit(0)
os.wait()
PY
pkill -KILL -u 1000 -f '^nestbox-victim' && echo "victim killed"`);
      const expected = ['root agent', 'root tini']
        .flatMap((label) => [0, 19, 15, 9].map((sig) => `${label} ${sig} 1`))
        .concat(['setns -1 1', "become the agent's uid: 22"])
        .concat([0, 19, 15, 9].map((sig) => `user agent ${sig} 1`))
        .concat(['victim killed']);
      expect(attack.stdout.trim().split('\n'), attack.stderr).toEqual(expected);
      // Nothing above reached the agent: it still answers, and it still signals workloads.
      // (nestbox-enter still raised the workload's oom_score_adj on its way in)
      expect((await sh(socket, 'cat /proc/self/oom_score_adj')).stdout).toBe(`${DEFAULT_WORKLOAD_OOM_SCORE_ADJ}\n`);
      // (a command past its timeout is killed by the agent)
      const timedOut = await sh(socket, 'echo before; sleep 60; echo after', 1_000);
      expect(timedOut.stdout).toBe('before\n');
      expect(timedOut.exitCode).not.toBe(0);
    });

    it('the agent loads no module from the sandbox: a package planted in /node_modules never runs', async () => {
      const id = uniqueId('mod');
      created.add(id);
      const runtime = await driver.create(spec(id));
      // ws (inside the agent bundle) would look for its optional add-ons from /.nestbox/lib up to /node_modules.
      const plant = await sh(runtime.agentSocket!, [
        'for name in bufferutil utf-8-validate; do mkdir -p /node_modules/$name',
        `printf '%s' "require('fs').writeFileSync('/tmp/agent-hijacked-'+process.pid, 'x'); module.exports = { mask() {}, unmask() {} };" > /node_modules/$name/index.js`,
        'echo \'{"name":"x","main":"index.js"}\' > /node_modules/$name/package.json; done; echo planted',
      ].join('\n'));
      expect(plant.stdout).toBe('planted\n');
      await driver.stop(id);
      const restarted = await driver.start(spec(id));
      const check = await sh(restarted.agentSocket!, 'ls /tmp | grep -c agent-hijacked || true');
      expect(check.stdout.trim()).toBe('0');
    });

    it("the agent's lazily imported chunks cannot be written, replaced or covered from inside, and load unchanged after an attempt", async () => {
      const id = uniqueId('chk');
      created.add(id);
      const runtime = await driver.create(spec(id));
      const hostChunks = readdirSync(join(REPO, 'dist', 'guest-agent-chunks')).sort();
      expect(hostChunks.length).toBeGreaterThan(0);
      const listed = await sh(runtime.agentSocket!, 'ls /.nestbox/lib/guest-agent-chunks');
      expect(listed.stdout.trim().split('\n')).toEqual(hostChunks);
      // Every way in as the sandbox's root: write, append, truncate, chmod, rename, delete, plant a
      // new chunk, mount over the directory, and the same on the entry.
      const attack = await sh(runtime.agentSocket!, [
        'cd /.nestbox/lib/guest-agent-chunks; for f in *.mjs; do',
        '  (printf "x" >> "$f") 2>/dev/null && echo "appended $f"',
        '  (: > "$f") 2>/dev/null && echo "truncated $f"',
        '  chmod 666 "$f" 2>/dev/null && echo "chmod $f"',
        '  mv "$f" "$f.x" 2>/dev/null && echo "moved $f"',
        '  rm -f "$f" 2>/dev/null; [ -e "$f" ] || echo "removed $f"',
        'done',
        'touch planted.mjs 2>/dev/null && echo planted',
        'mount -t tmpfs none /.nestbox/lib/guest-agent-chunks 2>/dev/null && echo mounted',
        'mount --bind /tmp /.nestbox/lib/guest-agent-chunks 2>/dev/null && echo bound',
        '(printf "x" >> /.nestbox/lib/guest-agent.mjs) 2>/dev/null && echo "appended entry"',
        'rm -f /.nestbox/lib/guest-agent.mjs 2>/dev/null; [ -e /.nestbox/lib/guest-agent.mjs ] || echo "removed entry"',
        'echo done',
      ].join('\n'));
      expect(attack.stdout).toBe('done\n');
      const hashes = await sh(runtime.agentSocket!, 'cd /.nestbox/lib/guest-agent-chunks && sha256sum *.mjs');
      const expected = hostChunks.map((name) => `${execFileSync('sha256sum', [join(REPO, 'dist', 'guest-agent-chunks', name)], { encoding: 'utf8' }).split(' ')[0]}  ${name}`);
      expect(hashes.stdout.trim().split('\n')).toEqual(expected);
      // The agent imports chunks now, after the attempt: the code interpreter's, the language
      // servers', OpenTelemetry's (a traced request) — and they work.
      const client = new AgentClient(runtime.agentSocket!);
      try {
        const languages = await client.request({ method: 'GET', path: '/kernels/languages' });
        languages.resume();
        expect(languages.statusCode).toBe(200);
        const lsp = await client.request({ method: 'POST', path: '/lsp/stop', headers: { 'content-type': 'application/json' }, body: '{}' });
        lsp.resume();
        expect(lsp.statusCode).toBe(400);
        const traced = await client.request({ method: 'GET', path: '/health', headers: { traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' } });
        traced.resume();
        expect(traced.statusCode).toBe(200);
        const spans = await client.request({ method: 'GET', path: '/telemetry/spans' });
        spans.resume();
        expect(spans.statusCode).toBe(200);
      } finally {
        client.close();
      }
    });

    it("the agent uses no library of the sandbox's: a replaced libstdc++ and an /etc/ld.so.preload never run in it", async () => {
      const id = uniqueId('lib');
      created.add(id);
      const runtime = await driver.create(spec(id));
      // A library whose constructor leaves /tmp/trojan-<program name> behind.
      const build = mkdtempSync('/tmp/nbxe-trojan-');
      try {
        writeFileSync(
          join(build, 'trojan.c'),
          '#include <fcntl.h>\n#include <stdio.h>\n#include <unistd.h>\n__attribute__((constructor)) static void ran(void) { char comm[64] = {0}, path[128]; int fd = open("/proc/self/comm", O_RDONLY); if (fd >= 0) { read(fd, comm, sizeof comm - 1); close(fd); } for (char *c = comm; *c; c++) if (*c == 10) *c = 0; snprintf(path, sizeof path, "/tmp/trojan-%s", comm); close(open(path, O_CREAT | O_WRONLY, 0644)); }\n',
        );
        execFileSync('cc', ['-shared', '-fPIC', '-o', join(build, 'trojan.so'), join(build, 'trojan.c')]);
        const client = new AgentClient(runtime.agentSocket!);
        await client.writeFile('/opt/trojan.so', Readable.from([readFileSync(join(build, 'trojan.so'))]));
        client.close();
      } finally {
        rmSync(build, { recursive: true, force: true });
      }
      const plant = await sh(runtime.agentSocket!, 'stdcxx=$(readlink -f /usr/lib/x86_64-linux-gnu/libstdc++.so.6 2>/dev/null || readlink -f /usr/lib/aarch64-linux-gnu/libstdc++.so.6) && cp /opt/trojan.so "$stdcxx" && echo /opt/trojan.so > /etc/ld.so.preload && find /tmp -name "trojan-*" -delete && echo planted');
      expect(plant.stdout).toBe('planted\n');
      await driver.stop(id);
      const restarted = await driver.start(spec(id));
      const markers = await sh(restarted.agentSocket!, 'ls /tmp | grep trojan- || true; cat /etc/ld.so.preload | wc -c');
      // Nothing at all ran it: the preload file was masked before anything started.
      expect(markers.stdout).toBe('0\n');
    });

    it('the sandbox has no writable cgroup file: the agent stays in `agent`, workloads stay in `work`', async () => {
      const id = uniqueId('cgv');
      created.add(id);
      const runtime = await driver.create(spec(id));
      const agent = agentPidOf(await sandboxPids(cgroups, ownerId, id));
      const attempt = await sh(runtime.agentSocket!, [
        'ls -A /sys/fs/cgroup | wc -l',
        'find / -xdev \\( -name cgroup.procs -o -name tasks \\) 2>/dev/null | wc -l',
        'mkdir -p /tmp/cg && mount -t cgroup -o pids none /tmp/cg 2>/dev/null && echo MOUNTED || echo no-mount',
        'mount -t cgroup2 none /tmp/cg 2>/dev/null && echo MOUNTED || echo no-mount',
        'grep -E "^[0-9]+:pids:" /proc/self/cgroup | sed "s/.*\\///"',
      ].join('; '));
      expect(attempt.stdout).toBe('0\n0\nno-mount\nno-mount\nwork\n');
      const pidsCgroup = (pid: number) => readFileSync(`/proc/${pid}/cgroup`, 'utf8').split('\n').find((line) => /^\d+:(pids|):/.test(line) && line.includes('/nestbox/'))!;
      expect(pidsCgroup(agent)).toMatch(new RegExp(`/nestbox/${ownerId}/${id}/agent$`));
    });
  });


  describe('finding 11: no host paths in mountinfo, no empty cgroups left', () => {
    it('/proc/self/mountinfo names neither the data dir nor the image cache', async () => {
      const id = uniqueId('mnt');
      created.add(id);
      const runtime = await driver.create(spec(id));
      const mountinfo = await sh(runtime.agentSocket!, 'cat /proc/self/mountinfo /proc/1/mountinfo');
      expect(mountinfo.stdout).toContain(' / / ');
      for (const hostPath of [dataDir, IMAGES_DIR, REPO, id]) expect(mountinfo.stdout, hostPath).not.toContain(hostPath);
      expect(mountinfo.stdout).not.toMatch(/(lower|upper|work)dir\+?=[^,]*\/(sandboxes|snapshots|rootfs)/);
    });

    it("a clean shutdown leaves no empty cgroup directory of the host agent's own", async () => {
      const owner = uniqueId('escgc');
      const ownerGroup = cgroups.groupFor(`nestbox/${owner}`);
      const newDriver = () => new LocalDriver({ dataDir, imagesDir: IMAGES_DIR, guestAgentBundle: AGENT_BUNDLE, ownerId: owner, slotPoolSize: 0 });
      const first = newDriver();
      await first.init();
      const id = uniqueId('gc');
      await first.create(spec(id));
      // A running sandbox outlives its host agent, and keeps its groups.
      await first.close();
      for (const path of ownerGroup.paths) expect(existsSync(join(path, id)), path).toBe(true);
      const second = newDriver();
      await second.init();
      await second.destroy(id);
      await second.close();
      for (const path of ownerGroup.paths) expect(existsSync(path), path).toBe(false);
    }, 120_000);
  });

});

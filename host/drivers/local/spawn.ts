// Launching a sandbox: a detached process chain that joins the sandbox's cgroups and network
// namespace, creates its own mount/pid/uts/ipc namespaces, assembles the root filesystem
// (overlayfs + /proc + /dev + /sys + /.nestbox) inside the new mount namespace, switches root,
// drops capabilities and execs tini → guest agent.
//
//   perl (stage 0, host)         closes every inherited descriptor but stdio, execs stage 1
//   /bin/sh (stage 1, host)      joins the cgroups by writing its own pid, then
//   nsenter --net → unshare      new mount/pid/uts/ipc namespaces; unshare stays as the parent
//   /bin/sh (stage 2, PID 1)     builds the root under <sandbox>/rootfs with host binaries:
//                                nestbox-rootfs makes the sandbox's user namespace and mounts
//                                the overlay from idmapped layers (see nestbox-rootfs.c)
//   perl (stage 3, PID 1)        binds the agent's listening socket on the host side, opens the
//                                workload cgroup's procs files, then pivot_root, detach the old
//                                root, hostname, join the user namespace as its root, fresh
//                                session keyring, drop capabilities
//   nestbox-seccomp              installs the seccomp profile, makes the workloads' user
//                                namespace and becomes the agent's uid (nestbox-seccomp.c)
//   tini-static → node agent     the sandbox proper; the agent serves the inherited socket
//
// User namespace: root inside is host uid/gid `idRange.base` (an unprivileged host user of the
// sandbox's own, see id-ranges.ts), so nothing in the sandbox holds a capability over a host
// resource, kernel keyrings (per user namespace) are its own, and two sandboxes never share a
// uid. Everything that needs host privilege (mounts, pivot_root, hostname, opening the cgroup
// files) happens before stage 3 joins the namespace; the mount, UTS, IPC and network namespaces
// stay owned by the host's user namespace, so sandbox root cannot mount anything either.
// Workloads join the `work` cgroup through the procs files stage 3 opened (inherited by the
// agent as descriptors; nestbox-enter writes its pid and closes them): the sandbox has no
// writable cgroup file at all, and the host-owned files refuse its uid anyway.
//
// Why the socket is made here and inherited: if the agent bound it inside a directory the
// sandbox can write, the sandbox could swap the socket for a symlink to any host socket and
// the host agent would connect there as root. Bound before the root switch, the socket lives
// in a host directory the sandbox never sees; the agent only gets the file descriptor.
//
// Why stage 0: Node marks its own descriptors close-on-exec, but not ones it inherited without
// that flag from whoever started the host agent (a shell's `exec 251>…`, a supervisor's pipe).
// Without stage 0 those reach the launcher and, through it, tini, the agent and every workload.
// Stage 3 closes everything again right before exec, keeping only the descriptors it means to
// pass (see PASSED_FDS), so a later stage opening something by mistake cannot leak it either.
//
// Why perl for stage 3: after pivot_root every path lookup resolves inside the sandbox's root,
// whose upper layer the sandbox itself can write. Executing any dynamically linked program
// there while we still hold full capabilities (setpriv, umount, hostname…) would run the
// sandbox's own ld.so/libc/ld.so.preload as real root — a full escape on the next start. perl
// (from perl-base, Essential in Debian) is loaded from the host *before* the switch and does the
// remaining steps with its builtin syscall(); the only thing executed inside the new root is the
// statically linked tini, already capability-reduced. setpriv cannot do this: it would have to
// run before pivot_root, which itself needs CAP_SYS_ADMIN.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import type { Socket } from 'node:net';
import { encodeAgentKey } from '../../agent-protocol/auth.js';
import { IDS_PER_SANDBOX } from './id-ranges.js';
import { assertSafeHostPath } from '../../util/fs.js';
import { GUEST_AGENT_CHUNKS_DIR } from '../../util/guest-agent-bundle.js';
import { volumePathProblem } from '../../storage/volumes.js';
import { basename, dirname, join } from 'node:path';

export const IN_SANDBOX_NODE = '/.nestbox/bin/node';
export const IN_SANDBOX_TINI = '/.nestbox/bin/tini';
/** The host's loader and libraries for the agent (runtime-binaries.ts hostLoaderFor). */
export const IN_SANDBOX_LOADER = '/.nestbox/lib/host/ld.so';
export const IN_SANDBOX_HOST_LIBS = '/.nestbox/lib/host';
/** Installs the seccomp profile, then execs tini (nestbox-seccomp.c). */
export const IN_SANDBOX_SECCOMP = '/.nestbox/bin/nestbox-seccomp';
export const IN_SANDBOX_AGENT = '/.nestbox/lib/guest-agent.mjs';
/** The guest agent's default ProcessServiceOptions.ptyHelper. */
export const IN_SANDBOX_PTY_HELPER = '/.nestbox/bin/nestbox-pty';
/** Placeholder in the agent's argv that stage 3 replaces with the inherited socket's fd number. */
export const LISTEN_FD_PLACEHOLDER = '@LISTEN_FD@';
/** Placeholder stage 3 replaces with the workload cgroup's procs fds, comma-separated ("-" = none). */
export const WORK_CGROUP_FDS_PLACEHOLDER = '@WORK_CGROUP_FDS@';
/** Placeholder nestbox-seccomp replaces with its descriptor of the workloads' user namespace. */
export const WORKLOAD_USERNS_FD_PLACEHOLDER = '@WORKLOAD_USERNS_FD@';
/**
 * The guest agent's real and saved uid inside the sandbox: the last id of the sandbox's range,
 * the one id the workloads' user namespace leaves unmapped (see nestbox-seccomp.c --agent-uid),
 * so no workload can ever hold it and none can signal the agent.
 */
export const AGENT_UID = IDS_PER_SANDBOX - 1;
export const SANDBOX_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** Capabilities the sandbox keeps (Docker's default set minus CAP_MKNOD: we run no devices cgroup). */
export const KEPT_CAPABILITIES: Record<string, number> = {
  chown: 0,
  dac_override: 1,
  fowner: 3,
  fsetid: 4,
  kill: 5,
  setgid: 6,
  setuid: 7,
  setpcap: 8,
  net_bind_service: 10,
  net_raw: 13,
  sys_chroot: 18,
  audit_write: 29,
  setfcap: 31,
};

interface SyscallNumbers {
  pivotRoot: number;
  umount2: number;
  prctl: number;
  sethostname: number;
  setns: number;
  setgroups: number;
  setresgid: number;
  setresuid: number;
  keyctl: number;
  mount: number;
}

const SYSCALLS: Partial<Record<NodeJS.Architecture, SyscallNumbers>> = {
  x64: { pivotRoot: 155, umount2: 166, prctl: 157, sethostname: 170, setns: 308, setgroups: 116, setresgid: 119, setresuid: 117, keyctl: 250, mount: 165 },
  arm64: { pivotRoot: 41, umount2: 39, prctl: 167, sethostname: 161, setns: 268, setgroups: 159, setresgid: 149, setresuid: 147, keyctl: 219, mount: 40 },
};

export function syscallNumbers(arch: NodeJS.Architecture = process.arch): SyscallNumbers {
  const numbers = SYSCALLS[arch];
  if (!numbers) throw new Error(`the local driver does not know the syscall numbers for ${arch}`);
  return numbers;
}

export async function lastCapability(): Promise<number> {
  return Number((await readFile('/proc/sys/kernel/cap_last_cap', 'utf8')).trim());
}

// Stage 0: the spawned process. Closes every descriptor but 0-2 and the NESTBOX_PASSED_FDS
// descriptors from 3 on (LaunchPlan.passedFds), then execs stage 1 (argv).
const STAGE0 = `use strict;
use POSIX ();
my $lastPassed = 2 + ($ENV{NESTBOX_PASSED_FDS} // 0);
opendir(my $fds, '/proc/self/fd') or die "nestbox launcher: /proc/self/fd: $!\\n";
my @open = grep { /^\\d+$/ && $_ > $lastPassed } readdir($fds);
closedir($fds);
POSIX::close($_) for @open;
exec { $ARGV[0] } @ARGV;
die "nestbox launcher: exec $ARGV[0]: $!\\n";
`;

// Stage 1: runs on the host (exec'd by stage 0). Args: netns path, cgroup.procs files, "--",
// then everything for stage 2.
const STAGE1 = `set -eu
netns=$1; shift
while [ "$1" != "--" ]; do echo $$ > "$1"; shift; done
shift
# The scripts travel in the environment (eval) so the long-lived unshare's argv stays short.
if [ -n "$netns" ]; then
  exec nsenter --net="$netns" -- unshare --mount --pid --uts --ipc --fork --kill-child --propagation private -- /bin/sh -c 'eval "$NESTBOX_STAGE2"' nestbox-stage2 "$@"
fi
# No slot (a file view): a new, empty network namespace with only a down loopback.
exec unshare --net --mount --pid --uts --ipc --fork --kill-child --propagation private -- /bin/sh -c 'eval "$NESTBOX_STAGE2"' nestbox-stage2 "$@"
`;

// Stage 2: PID 1 of the new PID namespace, still in the host's root (so only host binaries run),
// in a private copy of the host's mount namespace: nothing mounted here is visible outside and
// everything vanishes with the namespace. Environment: NESTBOX_ROOTFS (the nestbox-rootfs
// helper), NESTBOX_ID_BASE/NESTBOX_ID_COUNT (the sandbox's host id range).
const STAGE2 = `set -euf
lower=$1 upper=$2 work=$3 root=$4 run=$5 node=$6 tini=$7 agent=$8 pty=$9
shift 9
ids=$NESTBOX_ID_BASE
# The host rules only know IPv4; the slot gets no IPv6 at all.
echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 2>/dev/null || true
echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6 2>/dev/null || true
# Our own PID namespace's procfs: nestbox-rootfs finds its helper child's maps there.
mount -t proc -o nosuid,nodev,noexec proc /proc
# The user namespace is pinned on run/userns (a host directory the sandbox never sees).
: > "$run/userns"
if [ -n "$upper" ]; then disk=\${upper%/upper}; else disk=-; fi
# Word splitting on ':' only (and no globbing, set -f): one argument per layer, topmost first.
old_ifs=$IFS; IFS=:
"$NESTBOX_ROOTFS" "$run/userns" "$ids" "$NESTBOX_ID_COUNT" "$root" "$disk" $lower
IFS=$old_ifs
# The sandbox owns its upper layer: a symlink here would point our mounts at host paths.
for dir in proc sys dev .nestbox; do
  if [ -L "$root/$dir" ]; then echo "nestbox launcher: /$dir is a symlink in the sandbox; refusing to start" >&2; exit 1; fi
  mkdir -p "$root/$dir"
done
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
# Kernel-global knobs (core_pattern, sysrq…) stay read-only; a few info leaks are masked.
for entry in sys sysrq-trigger irq bus fs; do
  if [ -e "$root/proc/$entry" ]; then
    mount --bind "$root/proc/$entry" "$root/proc/$entry"
    mount -o remount,bind,ro,nosuid,nodev,noexec "$root/proc/$entry"
  fi
done
for entry in kcore keys timer_list sched_debug; do
  if [ -f "$root/proc/$entry" ]; then mount --bind /dev/null "$root/proc/$entry"; fi
done
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
# The sandbox's own limits (lxcfs.ts): LXCFS's files over /proc's and /sys's, read-only.
if [ -n "\${NESTBOX_LXCFS:-}" ]; then
  for entry in $NESTBOX_LXCFS_FILES; do
    if [ -f "$NESTBOX_LXCFS/$entry" ] && [ -f "$root/$entry" ]; then
      mount --bind "$NESTBOX_LXCFS/$entry" "$root/$entry"
      mount -o remount,bind,ro,nosuid,nodev,noexec "$root/$entry"
    fi
  done
fi
# tmpfs and devpts get the sandbox's root (and tty group) as owners, so they look like a
# normal system's from inside instead of belonging to "nobody".
mount -t tmpfs -o nosuid,noexec,mode=755,size=1m,uid=$ids,gid=$ids dev "$root/dev"
mknod -m 666 "$root/dev/null" c 1 3
mknod -m 666 "$root/dev/zero" c 1 5
mknod -m 666 "$root/dev/full" c 1 7
mknod -m 666 "$root/dev/random" c 1 8
mknod -m 666 "$root/dev/urandom" c 1 9
mknod -m 666 "$root/dev/tty" c 5 0
chown "$ids:$ids" "$root/dev/null" "$root/dev/zero" "$root/dev/full" "$root/dev/random" "$root/dev/urandom" "$root/dev/tty"
mkdir "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=$((ids + 5)),nosuid,noexec devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o nosuid,nodev,mode=1777,uid=$ids,gid=$ids shm "$root/dev/shm"
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
mount -t tmpfs -o nosuid,nodev,mode=755,size=64k,uid=$ids,gid=$ids nestbox "$root/.nestbox"
mkdir "$root/.nestbox/bin" "$root/.nestbox/lib"
chown "$ids:$ids" "$root/.nestbox/bin" "$root/.nestbox/lib"
touch "$root/.nestbox/bin/node" "$root/.nestbox/bin/tini" "$root/.nestbox/bin/nestbox-seccomp" "$root/.nestbox/lib/guest-agent.mjs"
mount --bind -o ro,nosuid,nodev "$node" "$root/.nestbox/bin/node"
mount --bind -o ro,nosuid,nodev "$tini" "$root/.nestbox/bin/tini"
mount --bind -o ro,nosuid,nodev "$NESTBOX_SECCOMP" "$root/.nestbox/bin/nestbox-seccomp"
mount --bind -o ro,nosuid,nodev "$agent" "$root/.nestbox/lib/guest-agent.mjs"
# The chunks the agent imports lazily (util/guest-agent-bundle.ts), beside its entry.
mkdir "$root/.nestbox/lib/${GUEST_AGENT_CHUNKS_DIR}"
mount --bind -o ro,nosuid,nodev "\${agent%/*}/${GUEST_AGENT_CHUNKS_DIR}" "$root/.nestbox/lib/${GUEST_AGENT_CHUNKS_DIR}"
if [ -n "\${NESTBOX_HOST_LIBS:-}" ]; then
  mkdir "$root/.nestbox/lib/host"
  chown "$ids:$ids" "$root/.nestbox/lib/host"
  old_ifs=$IFS; IFS=:
  for entry in $NESTBOX_HOST_LIBS; do
    name=\${entry%%=*}
    touch "$root/.nestbox/lib/host/$name"
    mount --bind -o ro,nosuid,nodev "\${entry#*=}" "$root/.nestbox/lib/host/$name"
  done
  IFS=$old_ifs
fi
if [ -n "$pty" ]; then
  touch "$root/.nestbox/bin/nestbox-pty"
  mount --bind -o ro,nosuid,nodev "$pty" "$root/.nestbox/bin/nestbox-pty"
fi
# The workload launcher (see nestbox-enter.c); the workload cgroup is reached through
# descriptors stage 3 opens, never through a file in the sandbox.
if [ -n "\${NESTBOX_ENTER:-}" ]; then
  touch "$root/.nestbox/bin/nestbox-enter"
  mount --bind -o ro,nosuid,nodev "$NESTBOX_ENTER" "$root/.nestbox/bin/nestbox-enter"
fi
mount -o remount,ro,nosuid,nodev nestbox "$root/.nestbox"
# Volumes (LaunchPlan.volumes): one line each, source|subpath|mountPath|ro-or-rw; nestbox-rootfs
# walks both paths without following symlinks and attaches an idmapped clone by descriptor.
if [ -n "\${NESTBOX_VOLUMES:-}" ]; then
  printf '%s\n' "$NESTBOX_VOLUMES" | while IFS='|' read -r vsource vsubpath vpath vmode; do
    "$NESTBOX_ROOTFS" --volume "$run/userns" "$ids" "$root" "$vsource" "$vsubpath" "$vpath" "$vmode"
  done
fi
exec perl -e 'eval $ENV{NESTBOX_STAGE3}; die $@ if $@;' -- "$root" "$run/agent.sock" "$run/userns" "$@"
`;

// Stage 3: see the header comment. Args: root, agent socket path (host side), user namespace
// file, hostname, last capability, kept capabilities, syscall numbers, command…; the workload
// cgroup's procs files come in NESTBOX_WORK_PROCS (colon-separated); the sandbox's environment
// comes as NESTBOX_ENV_<name> variables (never argv: /proc/<pid>/cmdline is world-readable,
// environ is not).
const STAGE3 = `use strict;
use Socket qw(PF_UNIX SOCK_STREAM pack_sockaddr_un);
use Fcntl qw(F_GETFD F_SETFD FD_CLOEXEC O_WRONLY O_RDONLY);
use POSIX ();
my ($root, $socketPath, $usernsPath, $hostname, $lastCap, $keptCaps, $nrPivot, $nrUmount2, $nrPrctl, $nrSethostname, $nrSetns, $nrSetgroups, $nrSetresgid, $nrSetresuid, $nrKeyctl, $nrMount) = splice(@ARGV, 0, 16);
my %kept = map { ($_ => 1) } split(/,/, $keptCaps);
my %env = map { /^NESTBOX_ENV_(.+)$/ ? ($1 => $ENV{$_}) : () } keys %ENV;
# Descriptors 3.. that the spawner passes through to the agent (LaunchPlan.passedFds).
my $passedCount = $ENV{NESTBOX_PASSED_FDS} // 0;
my @command = @ARGV;
sub fail { my $what = shift; print STDERR "nestbox launcher: $what: $!\\n"; exit 1; }
unlink($socketPath);
socket(my $listener, PF_UNIX, SOCK_STREAM, 0) or fail('socket');
bind($listener, pack_sockaddr_un($socketPath)) or fail("bind $socketPath");
chmod(0600, $socketPath) or fail("chmod $socketPath");
listen($listener, 128) or fail('listen');
sub inheritable { my $handle = shift; my $flags = fcntl($handle, F_GETFD, 0) or fail('fcntl F_GETFD'); fcntl($handle, F_SETFD, $flags & ~FD_CLOEXEC) or fail('fcntl F_SETFD'); return fileno($handle); }
my $listenFd = inheritable($listener);
# Opened here, as host root: the sandbox's uid could not open them, and it never sees them.
my (@workHandles, @workFds);
for my $procs (grep { length } split(/:/, $ENV{NESTBOX_WORK_PROCS} // '')) {
  sysopen(my $handle, $procs, O_WRONLY) or fail("open $procs");
  push @workHandles, $handle;
  push @workFds, inheritable($handle);
}
my $workFdList = @workFds ? join(',', @workFds) : '-';
@command = map { $_ eq '${LISTEN_FD_PLACEHOLDER}' ? $listenFd : $_ eq '${WORK_CGROUP_FDS_PLACEHOLDER}' ? $workFdList : $_ } @command;
sysopen(my $userns, $usernsPath, O_RDONLY) or fail("open $usernsPath");
chdir($root) or fail("chdir $root");
my $dot = '.';
syscall($nrPivot + 0, $dot, $dot) == 0 or fail('pivot_root');
syscall($nrUmount2 + 0, $dot, 2) == 0 or fail('detach the old root');
chdir('/') or fail('chdir /');
syscall($nrSethostname + 0, $hostname, length($hostname)) == 0 or fail('sethostname');
# Even the host's loader reads /etc/ld.so.preload, a file of the sandbox's: one that exists now
# (nothing in the sandbox runs yet) is masked with /dev/null, for the agent and everyone else.
# A symlink is followed, so its target is masked; a directory or a dangling link preloads nothing.
if (-f '/etc/ld.so.preload') {
  my ($devnull, $preload, $none) = ('/dev/null', '/etc/ld.so.preload', '');
  syscall($nrMount + 0, $devnull, $preload, $none, 4096, 0) == 0 or fail('mask /etc/ld.so.preload');
}
# Into the sandbox's user namespace (CLONE_NEWUSER), as its root: from here on every
# capability is one over the sandbox's own namespace only.
syscall($nrSetns + 0, fileno($userns), 0x10000000) == 0 or fail('join the user namespace');
close($userns);
syscall($nrSetgroups + 0, 0, 0) == 0 or fail('setgroups');
syscall($nrSetresgid + 0, 0, 0, 0) == 0 or fail('setresgid');
syscall($nrSetresuid + 0, 0, 0, 0) == 0 or fail('setresuid');
# A session keyring of its own (KEYCTL_JOIN_SESSION_KEYRING with no name): the one inherited
# from the host agent would otherwise stay "possessed" by every sandbox process.
syscall($nrKeyctl + 0, 1, 0) >= 0 or fail('join a new session keyring');
# CAP_SYS_ADMIN (21) stays for nestbox-seccomp alone: installing a filter without no_new_privs
# needs it; the helper drops it from the bounding set before it execs tini.
for my $cap (0 .. $lastCap) {
  next if $kept{$cap} || $cap == 21;
  syscall($nrPrctl + 0, 24, $cap, 0, 0, 0) == 0 or fail("drop capability $cap");
}
%ENV = %env;
# Only stdio and what we mean to pass survive into the sandbox (see the header comment).
my %passed = map { ($_ => 1) } (0 .. 2 + $passedCount, $listenFd, @workFds);
opendir(my $fds, '/proc/self/fd') or fail('/proc/self/fd');
my @unexpected = grep { /^\\d+$/ && !$passed{$_} } readdir($fds);
closedir($fds);
POSIX::close($_) for @unexpected;
exec { $command[0] } @command;
fail("exec $command[0]");
`;

export interface LaunchPlan {
  /** Network namespace to join; empty for a new, empty one (no slot). */
  netnsPath: string;
  cgroupProcsFiles: string[];
  /** The base image's root filesystem (the bottom overlay layer). */
  lowerDir: string;
  /** Read-only layers stacked on top of lowerDir, topmost first (snapshot layers). */
  layerDirs?: string[];
  /** Empty (with workDir) for a read-only root: then layerDirs must hold at least one layer. */
  upperDir: string;
  workDir: string;
  rootDir: string;
  runDir: string;
  nodeBinary: string;
  tiniBinary: string;
  /** The static PTY helper, mounted at /.nestbox/bin/nestbox-pty; absent = no terminals. */
  ptyHelperBinary?: string;
  /** The static workload launcher, mounted at /.nestbox/bin/nestbox-enter. */
  enterHelperBinary?: string;
  /** cgroup.procs files of the workload group: opened by stage 3, inherited by the agent as fds. */
  workProcsFiles?: string[];
  /** The static helper that makes the user namespace and mounts the root (nestbox-rootfs). */
  rootfsHelperBinary: string;
  /** The static helper that installs the seccomp profile (nestbox-seccomp), mounted in /.nestbox/bin. */
  seccompHelperBinary: string;
  /** Host ids of the sandbox's user namespace (id-ranges.ts). */
  idRange: { base: number; count: number };
  guestAgentBundle: string;
  hostname: string;
  /**
   * Descriptors the spawner hands the launcher at 3, 4, … (extra `stdio` entries) that must reach
   * the guest agent unchanged; every other inherited descriptor is closed. Default 0.
   */
  passedFds?: number;
  /** Run node on the host's loader and libraries (see hostLoaderFor); absent = node as is. */
  hostLoader?: { loader: string; libs: { soname: string; path: string }[] };
  /** The guest agent's complete environment. */
  env: Record<string, string>;
  logFile: string;
  lastCapability: number;
  /** The guest agent's per-boot proof key, handed over on AGENT_KEY_FD (see handOverAgentKey). */
  agentKey?: Buffer;
  /** Volumes to mount (issue 19): `source` is the volume's data dir on the host. */
  volumes?: LaunchVolume[];
  /** The host's LXCFS mount point (lxcfs.ts) and its files to bind over /proc and /sys; absent = none. */
  lxcfs?: { mountPoint: string; files: readonly string[] };
}

export interface LaunchVolume {
  source: string;
  /** A directory inside the volume to mount instead of its top (made if missing). */
  subpath?: string;
  /** Absolute path inside the sandbox (made if missing). */
  mountPath: string;
  readOnly: boolean;
}


export function assertValidEnv(env: Record<string, string>): void {
  for (const [name, value] of Object.entries(env)) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new Error(`invalid environment variable name "${name}"`);
    if (typeof value !== 'string' || value.includes('\0')) throw new Error(`environment variable ${name} must be a string without NUL bytes`);
  }
}

function prefixedEnv(env: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(env).map(([name, value]) => [`NESTBOX_ENV_${name}`, value]));
}

/** The overlay `lowerdir=` value: every layer, topmost first, colon-separated. */
export function overlayLowerOption(plan: Pick<LaunchPlan, 'lowerDir' | 'layerDirs'>): string {
  return [...(plan.layerDirs ?? []), plan.lowerDir].join(':');
}

export function buildLaunchArgs(plan: LaunchPlan): string[] {
  const numbers = syscallNumbers();
  const kept = Object.values(KEPT_CAPABILITIES).join(',');
  return [
    '-c',
    STAGE1,
    'nestbox-stage1',
    plan.netnsPath,
    ...plan.cgroupProcsFiles,
    '--',
    overlayLowerOption(plan),
    plan.upperDir,
    plan.workDir,
    plan.rootDir,
    plan.runDir,
    plan.nodeBinary,
    plan.tiniBinary,
    plan.guestAgentBundle,
    plan.ptyHelperBinary ?? '',
    plan.hostname,
    String(plan.lastCapability),
    kept,
    String(numbers.pivotRoot),
    String(numbers.umount2),
    String(numbers.prctl),
    String(numbers.sethostname),
    String(numbers.setns),
    String(numbers.setgroups),
    String(numbers.setresgid),
    String(numbers.setresuid),
    String(numbers.keyctl),
    String(numbers.mount),
    IN_SANDBOX_SECCOMP,
    // Only nestbox-enter can move workloads below the agent; without it they would start as the agent's uid.
    ...(plan.enterHelperBinary ? [`--agent-uid=${AGENT_UID}`] : []),
    IN_SANDBOX_TINI,
    '-s',
    '--',
    // The agent: on the host's loader (no library from the sandbox's disk) and with an empty
    // OpenSSL configuration (the sandbox's /etc/ssl/openssl.cnf could load an engine into it).
    ...(plan.hostLoader ? [IN_SANDBOX_LOADER, '--inhibit-cache', '--library-path', IN_SANDBOX_HOST_LIBS] : []),
    IN_SANDBOX_NODE,
    '--openssl-config=/dev/null',
    IN_SANDBOX_AGENT,
    '--listen-fd',
    LISTEN_FD_PLACEHOLDER,
    '--work-cgroup-fds',
    WORK_CGROUP_FDS_PLACEHOLDER,
    ...(plan.enterHelperBinary ? ['--workload-userns-fd', WORKLOAD_USERNS_FD_PLACEHOLDER] : []),
    ...(plan.agentKey ? ['--key-fd', String(AGENT_KEY_FD)] : []),
  ];
}

// ---- the agent's proof key (issue 11, finding 7; agent-protocol/auth.ts) ---------------------
//
// Descriptor 3 of the launcher is one end of a socket pair; the host agent writes the key into
// the other end and closes it at once. Every stage keeps descriptor 3 open without touching it
// (sh, nsenter, unshare, perl and tini neither read nor close inherited descriptors), and the
// guest agent (`--key-fd 3`) reads it to EOF and closes it before it serves anything, so no
// workload it starts inherits it. Why not a file or the environment: a file opened for the
// agent could be reopened through /proc/<pid>/fd by anyone who can see that process, and the
// environment is inherited by every workload. A drained socket has nothing left to read and
// cannot be reopened through /proc. (tini and the host-side unshare keep their copy of the
// drained end for the sandbox's lifetime; it reads as EOF.)
export const AGENT_KEY_FD = 3;

function handOverAgentKey(child: ChildProcess, key: Buffer): void {
  const channel = child.stdio[AGENT_KEY_FD] as Socket | null | undefined;
  if (!channel) throw new Error('the launcher has no key channel');
  // A launcher that died at once closes its end: the start fails on its own, not here.
  channel.on('error', () => {});
  // Written data stays queued for the reader after we close our end.
  channel.end(encodeAgentKey(key), () => channel.destroy());
}
// ---- end of the proof key handoff -------------------------------------------------------------

/**
 * Starts the chain detached (own session, stdio to the sandbox log, unref'd) so the sandbox
 * outlives the host agent. The returned child's pid is the launcher (unshare) for the whole
 * sandbox lifetime: perl, sh and nsenter exec into it.
 */
export function launchSandbox(plan: LaunchPlan): ChildProcess {
  const readOnly = plan.upperDir === '' && plan.workDir === '';
  if (readOnly && !plan.layerDirs?.length) throw new Error('a read-only launch needs at least one layer above the base image');
  // nestbox-rootfs clones one directory holding both (overlayfs wants them on one mount).
  if (!readOnly && (basename(plan.upperDir) !== 'upper' || plan.workDir !== join(dirname(plan.upperDir), 'work'))) {
    throw new Error(`the upper and work dirs must be <disk>/upper and <disk>/work (got ${plan.upperDir} and ${plan.workDir})`);
  }
  if (!Number.isInteger(plan.idRange.base) || plan.idRange.base < 1 || !Number.isInteger(plan.idRange.count) || plan.idRange.count < 1) throw new Error('invalid id range');
  if (plan.netnsPath) assertSafeHostPath('netns', plan.netnsPath);
  (plan.layerDirs ?? []).forEach((layer, index) => assertSafeHostPath(`layer ${index}`, layer));
  for (const [label, path] of Object.entries({
    lower: plan.lowerDir,
    ...(readOnly ? {} : { upper: plan.upperDir, work: plan.workDir }),
    root: plan.rootDir,
    run: plan.runDir,
    node: plan.nodeBinary,
    tini: plan.tiniBinary,
    agent: plan.guestAgentBundle,
    rootfs: plan.rootfsHelperBinary,
    seccomp: plan.seccompHelperBinary,
    ...(plan.ptyHelperBinary ? { pty: plan.ptyHelperBinary } : {}),
    ...(plan.enterHelperBinary ? { enter: plan.enterHelperBinary } : {}),
  })) {
    assertSafeHostPath(label, path);
  }
  (plan.workProcsFiles ?? []).forEach((file, index) => assertSafeHostPath(`workload cgroup ${index}`, file));
  if (plan.lxcfs) {
    assertSafeHostPath('lxcfs', plan.lxcfs.mountPoint);
    for (const file of plan.lxcfs.files) if (!/^[a-z]+(\/[a-z]+)*$/.test(file)) throw new Error(`invalid lxcfs file ${file}`);
  }
  assertValidEnv(plan.env);
  for (const [index, volume] of (plan.volumes ?? []).entries()) {
    assertSafeHostPath(`volume ${index}`, volume.source);
    const problem = volumePathProblem(volume.mountPath, 'mountPath') ?? (volume.subpath ? volumePathProblem(volume.subpath, 'subpath') : undefined);
    if (problem) throw new Error(`volume ${index}: ${problem}`);
    if (volume.source.includes('|') || volume.source.includes('\n')) throw new Error(`volume ${index}: invalid source path`);
  }
  if (plan.hostLoader) {
    assertSafeHostPath('loader', plan.hostLoader.loader);
    for (const lib of plan.hostLoader.libs) {
      assertSafeHostPath(`library ${lib.soname}`, lib.path);
      if (!/^[A-Za-z0-9._+-]+$/.test(lib.soname) || lib.soname === 'ld.so') throw new Error(`invalid library name ${lib.soname}`);
    }
  }
  // The agent's proof key arrives on AGENT_KEY_FD (3): it is one of the descriptors passed through.
  const passedFds = plan.passedFds ?? (plan.agentKey ? AGENT_KEY_FD - 2 : 0);
  if (!Number.isInteger(passedFds) || passedFds < 0 || passedFds > 8) throw new Error('passedFds must be an integer from 0 to 8');
  if (plan.agentKey && passedFds < AGENT_KEY_FD - 2) throw new Error('the agent key descriptor must be passed through');
  const logFd = openSync(plan.logFile, 'a', 0o600);
  try {
    const child = spawn('/usr/bin/perl', ['-e', 'eval $ENV{NESTBOX_STAGE0}; die $@ if $@;', '--', '/bin/sh', ...buildLaunchArgs(plan)], {
      detached: true,
      stdio: plan.agentKey ? ['ignore', logFd, logFd, 'pipe'] : ['ignore', logFd, logFd],
      cwd: '/',
      // Only what the stages need: the sandbox's own env is applied by stage 3, after the root
      // switch, so nothing in it (LD_PRELOAD…) can reach a privileged host binary.
      // NESTBOX_ENV_LD_PRELOAD is inert until stage 3 renames it.
      env: {
        PATH: '/usr/sbin:/usr/bin:/sbin:/bin',
        LC_ALL: 'C',
        NESTBOX_STAGE0: STAGE0,
        NESTBOX_STAGE2: STAGE2,
        NESTBOX_STAGE3: STAGE3,
        NESTBOX_PASSED_FDS: String(passedFds),
        ...(plan.hostLoader ? { NESTBOX_HOST_LIBS: [`ld.so=${plan.hostLoader.loader}`, ...plan.hostLoader.libs.map((lib) => `${lib.soname}=${lib.path}`)].join(':') } : {}),
        NESTBOX_ROOTFS: plan.rootfsHelperBinary,
        NESTBOX_SECCOMP: plan.seccompHelperBinary,
        NESTBOX_ID_BASE: String(plan.idRange.base),
        NESTBOX_ID_COUNT: String(plan.idRange.count),
        ...(plan.enterHelperBinary ? { NESTBOX_ENTER: plan.enterHelperBinary } : {}),
        ...(plan.workProcsFiles?.length ? { NESTBOX_WORK_PROCS: plan.workProcsFiles.join(':') } : {}),
        ...(plan.volumes?.length ? { NESTBOX_VOLUMES: plan.volumes.map((v) => [v.source, v.subpath ? v.subpath.replace(/^\/+/, '') || '-' : '-', v.mountPath, v.readOnly ? 'ro' : 'rw'].join('|')).join('\n') } : {}),
        ...(plan.lxcfs ? { NESTBOX_LXCFS: plan.lxcfs.mountPoint, NESTBOX_LXCFS_FILES: plan.lxcfs.files.join(' ') } : {}),
        ...prefixedEnv(plan.env),
      },
    });
    if (plan.agentKey) handOverAgentKey(child, plan.agentKey);
    child.unref();
    return child;
  } finally {
    closeSync(logFd);
  }
}

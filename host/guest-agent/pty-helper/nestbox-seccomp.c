/*
 * nestbox-seccomp: installs the sandbox's seccomp profile, then execs PROGRAM.
 *
 *   nestbox-seccomp [--print] [--agent-uid=UID] PROGRAM [ARG...]
 *
 * The launcher's last stage (host/drivers/local/spawn.ts) runs it as the sandbox's root, inside
 * the sandbox's user namespace, right before tini: the filter is inherited by tini, the guest
 * agent and every workload, and no process in the sandbox can remove it. It is built with
 * libseccomp (no hand-assembled BPF). The only capability the launcher leaves it beyond the
 * sandbox's usual set is CAP_SYS_ADMIN in the sandbox's own user namespace, which the kernel
 * requires to install a filter without no_new_privs (no_new_privs would break sudo and every
 * other setuid program); it drops that from the bounding set before exec, so PROGRAM never has it.
 *
 * --agent-uid=UID (issue 11, finding 7: a workload must not be able to signal its guest agent)
 * also splits the agent from its workloads:
 *   1. it creates the workloads' user namespace, a child of the sandbox's, mapping ids
 *      0..UID-1 onto the same ids of the sandbox (so files, users and setuid programs look
 *      exactly as before) and leaving UID out; the namespace's descriptor replaces the
 *      argument "@WORKLOAD_USERNS_FD@" of PROGRAM's command line. The guest agent hands it to
 *      nestbox-enter, which moves every workload into it;
 *   2. it becomes UID (real, effective and saved uid; groups unchanged) with its capabilities
 *      kept as ambient ones, so tini and the agent run as UID with the usual capability set.
 *      The agent then takes root as its effective uid only (seteuid(0)), so it still acts on
 *      files as root while its real and saved uid stay UID.
 * Together: the kernel lets a process signal another if it holds CAP_KILL in the target's user
 * namespace, or if its uid matches the target's real or saved uid. Workloads hold capabilities
 * only in their own namespace, below the agent's, and no workload can ever have uid UID (it is
 * not mapped in theirs). So no workload, not even root, can stop, kill or signal tini or the
 * agent, while the agent (the namespace's owner, one level up) can still signal every workload.
 * Why ambient capabilities and not setresuid(UID, 0, UID) before exec: an exec whose effective
 * uid differs from the real one runs in secure mode (AT_SECURE), in which the host's loader
 * refuses to run as a program and the C library strips variables such as LD_LIBRARY_PATH and
 * TMPDIR from the environment the workloads inherit.
 *
 * The profile (README "Seccomp profile"): every system call is allowed except the ones below,
 * which fail with EPERM (clone3 with ENOSYS, so the C library falls back to clone, whose flags
 * a filter can inspect). Docker's default profile denies all of these too; a sandbox here has
 * no capability outside its own user namespace, so most would fail anyway, and the filter keeps
 * their kernel code out of reach entirely. The one exception is setns into a user namespace
 * (nstype CLONE_NEWUSER exactly), which nestbox-enter needs to move a workload into the
 * workloads' namespace; it then adds a filter of its own that denies setns altogether. To change
 * the profile, edit DENIED (and, for argument filters, build_filter) and rebuild (`npm run build`);
 * `nestbox-seccomp --print` prints the resulting BPF program in libseccomp's pseudo-filter syntax.
 * Syscalls other architectures would use (i386 int 0x80, x32) are killed: only the native ABI
 * is allowed in.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>
#include <linux/capability.h>

#define WORKLOAD_USERNS_PLACEHOLDER "@WORKLOAD_USERNS_FD@"

static const char *const DENIED[] = {
  /* kernel keyrings: shared kernel state with a long history of bugs */
  "add_key", "keyctl", "request_key",
  /* tracing, BPF and memory tricks that widen the kernel attack surface */
  "bpf", "perf_event_open", "userfaultfd", "lookup_dcookie",
  /* io_uring: a second syscall interface seccomp cannot see into */
  "io_uring_setup", "io_uring_enter", "io_uring_register",
  /* the kernel itself: modules, kexec, reboot, swap, accounting, clock, kernel log */
  "init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms",
  "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
  "settimeofday", "clock_settime", "clock_adjtime", "syslog",
  "iopl", "ioperm", "quotactl", "quotactl_fd", "nfsservctl", "_sysctl", "uselib", "ustat", "sysfs",
  "vm86", "vm86old",
  /* file handles bypass path-based checks (the "shocker" escape) */
  "open_by_handle_at",
  /* mounts and namespaces: the sandbox's mount, UTS, IPC and network namespaces belong to the
     host's user namespace; new user namespaces would hand out fresh capabilities */
  "mount", "umount", "umount2", "pivot_root",
  "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
  "unshare",
  /* NUMA policy of other processes, raw memory of other processes */
  "mbind", "set_mempolicy", "migrate_pages", "move_pages", "process_vm_readv", "process_vm_writev",
  /* fanotify watches whole file systems */
  "fanotify_init",
  NULL,
};

static void fail(const char *what, int error) {
  fprintf(stderr, "nestbox-seccomp: %s: %s\n", what, strerror(error < 0 ? -error : error));
  exit(125);
}

static scmp_filter_ctx build_filter(void) {
  scmp_filter_ctx filter = seccomp_init(SCMP_ACT_ALLOW);
  if (!filter) fail("seccomp_init", ENOMEM);
  int rc = seccomp_attr_set(filter, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
  if (rc < 0) fail("bad-architecture action", rc);
  /* libseccomp sets no_new_privs before loading unless told not to; with it set, sudo and every
     other setuid program refuse to run (the vendors' default users rely on sudo). We hold
     CAP_SYS_ADMIN here, so the kernel takes the filter without it. */
  rc = seccomp_attr_set(filter, SCMP_FLTATR_CTL_NNP, 0);
  if (rc < 0) fail("leave no_new_privs unset", rc);
  for (int i = 0; DENIED[i]; i++) {
    int nr = seccomp_syscall_resolve_name(DENIED[i]);
    if (nr == __NR_SCMP_ERROR) continue; /* not on this architecture */
    rc = seccomp_rule_add(filter, SCMP_ACT_ERRNO(EPERM), nr, 0);
    /* A pseudo-syscall libseccomp cannot express on this architecture is not an error. */
    if (rc < 0 && rc != -EDOM) fail(DENIED[i], rc);
  }
  /* clone with any namespace flag: one rule per flag (rules are alternatives). */
  const unsigned long flags[] = {CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP, CLONE_NEWTIME};
  for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
    rc = seccomp_rule_add(filter, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1, SCMP_A0(SCMP_CMP_MASKED_EQ, flags[i], flags[i]));
    if (rc < 0) fail("clone rule", rc);
  }
  /* setns only into a user namespace (see the header), compared as the int the kernel reads. */
  rc = seccomp_rule_add(filter, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(setns), 1, SCMP_A1_32(SCMP_CMP_NE, CLONE_NEWUSER));
  if (rc < 0) fail("setns rule", rc);
  /* clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc use clone. */
  rc = seccomp_rule_add(filter, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  if (rc < 0) fail("clone3 rule", rc);
  return filter;
}

static void write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail(path, errno);
  if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) fail(path, errno);
  close(fd);
}

/*
 * Step 1 of --agent-uid: the workloads' user namespace, made by a short-lived child (a process
 * cannot write its own wide map); returns a descriptor that keeps it alive, inherited by PROGRAM.
 */
static int create_workload_namespace(long agent_uid) {
  int ready[2], done[2];
  if (pipe2(ready, O_CLOEXEC) < 0 || pipe2(done, O_CLOEXEC) < 0) fail("pipe", errno);
  pid_t child = fork();
  if (child < 0) fail("fork", errno);
  if (child == 0) {
    char byte = 'u';
    if (unshare(CLONE_NEWUSER) < 0) _exit(1);
    /*
     * This program is execute-only, so the kernel made it non-dumpable and owns its /proc files
     * to the host's root, which the parent cannot open. Only this child, which runs nothing and
     * exits as soon as the parent is done, becomes dumpable, so its maps can be written.
     */
    if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) < 0) _exit(1);
    if (write(ready[1], &byte, 1) != 1) _exit(1);
    close(done[1]);
    ssize_t ignored = read(done[0], &byte, 1); /* until the parent holds the namespace */
    (void)ignored;
    _exit(0);
  }
  close(ready[1]);
  close(done[0]);
  char byte;
  if (read(ready[0], &byte, 1) != 1) fail("create the workloads' user namespace", ECHILD);
  char path[64], map[64];
  /* uids: everything but the agent's; gids: all of the sandbox's (groups play no part in signals). */
  snprintf(map, sizeof map, "0 0 %ld\n", agent_uid);
  snprintf(path, sizeof path, "/proc/%d/uid_map", (int)child);
  write_file(path, map);
  snprintf(path, sizeof path, "/proc/%d/gid_map", (int)child);
  snprintf(map, sizeof map, "0 0 %ld\n", agent_uid + 1);
  write_file(path, map);
  snprintf(path, sizeof path, "/proc/%d/ns/user", (int)child);
  int userns = open(path, O_RDONLY); /* no O_CLOEXEC: PROGRAM inherits it */
  if (userns < 0) fail(path, errno);
  close(done[1]);
  close(ready[0]);
  int status;
  if (waitpid(child, &status, 0) < 0) fail("waitpid", errno);
  return userns;
}

/* Step 2 of --agent-uid: become agent_uid, keeping the current capabilities (minus CAP_SYS_ADMIN) as ambient ones. */
static void become_agent(long agent_uid) {
  if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0) fail("PR_SET_KEEPCAPS", errno);
  if (setresuid((uid_t)agent_uid, (uid_t)agent_uid, (uid_t)agent_uid) < 0) fail("setresuid", errno);
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
  if (syscall(SYS_capget, &header, data) < 0) fail("capget", errno);
  data[CAP_TO_INDEX(CAP_SYS_ADMIN)].permitted &= ~CAP_TO_MASK(CAP_SYS_ADMIN);
  for (int i = 0; i < _LINUX_CAPABILITY_U32S_3; i++) {
    data[i].effective = data[i].permitted;
    data[i].inheritable = data[i].permitted;
  }
  if (syscall(SYS_capset, &header, data) < 0) fail("capset", errno);
  for (int cap = 0; cap <= 63; cap++) {
    if (!(data[CAP_TO_INDEX(cap)].permitted & CAP_TO_MASK(cap))) continue;
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) < 0) fail("raise an ambient capability", errno);
  }
}

static long parse_agent_uid(const char *text) {
  char *end = NULL;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (errno || !end || *end || value < 1 || value > 65535) {
    fprintf(stderr, "nestbox-seccomp: invalid --agent-uid \"%s\"\n", text);
    exit(125);
  }
  return value;
}

int main(int argc, char **argv) {
  int print = 0;
  long agent_uid = -1;
  while (argc > 1 && strncmp(argv[1], "--", 2) == 0) {
    if (strcmp(argv[1], "--print") == 0) print = 1;
    else if (strncmp(argv[1], "--agent-uid=", 12) == 0) agent_uid = parse_agent_uid(argv[1] + 12);
    else break;
    argv++;
    argc--;
  }
  if (argc < 2 && !print) {
    fprintf(stderr, "usage: nestbox-seccomp [--print] [--agent-uid=UID] PROGRAM [ARG...]\n");
    return 125;
  }
  scmp_filter_ctx filter = build_filter();
  if (print) {
    seccomp_export_pfc(filter, STDOUT_FILENO);
    return 0;
  }
  /* Before the filter, which denies unshare. */
  char userns_fd[16] = "";
  if (agent_uid > 0) snprintf(userns_fd, sizeof userns_fd, "%d", create_workload_namespace(agent_uid));
  int rc = seccomp_load(filter);
  if (rc < 0) fail("install the filter", rc);
  seccomp_release(filter);
  if (prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) < 0) fail("drop CAP_SYS_ADMIN", errno);
  if (agent_uid > 0) {
    become_agent(agent_uid);
    for (int i = 1; i < argc; i++)
      if (strcmp(argv[i], WORKLOAD_USERNS_PLACEHOLDER) == 0) argv[i] = userns_fd;
  }
  execvp(argv[1], argv + 1);
  int failure = errno;
  fprintf(stderr, "nestbox-seccomp: %s: %s\n", argv[1], strerror(failure));
  return failure == ENOENT ? 127 : 126;
}

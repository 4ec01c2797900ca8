/*
 * nestbox-seccomp: installs the sandbox's seccomp profile, then execs PROGRAM.
 *
 *   nestbox-seccomp [--print] PROGRAM [ARG...]
 *
 * The launcher's last stage (host/drivers/local/spawn.ts) runs it as the sandbox's root, inside
 * the sandbox's user namespace, right before tini: the filter is inherited by tini, the guest
 * agent and every workload, and no process in the sandbox can remove it. It is built with
 * libseccomp (no hand-assembled BPF). The only capability the launcher leaves it beyond the
 * sandbox's usual set is CAP_SYS_ADMIN in the sandbox's own user namespace, which the kernel
 * requires to install a filter without no_new_privs (no_new_privs would break sudo and every
 * other setuid program); it drops that from the bounding set before exec, so PROGRAM never has it.
 *
 * The profile (README "Seccomp profile"): every system call is allowed except the ones below,
 * which fail with EPERM (clone3 with ENOSYS, so the C library falls back to clone, whose flags
 * a filter can inspect). Docker's default profile denies all of these too; a sandbox here has
 * no capability outside its own user namespace, so most would fail anyway, and the filter keeps
 * their kernel code out of reach entirely. To change the profile, edit DENIED (and, for
 * argument filters, main) and rebuild (`npm run build`); `nestbox-seccomp --print` prints the
 * resulting BPF program in libseccomp's pseudo-filter syntax.
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
#include <unistd.h>
#include <linux/capability.h>

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
  "unshare", "setns",
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
  /* clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc use clone. */
  rc = seccomp_rule_add(filter, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  if (rc < 0) fail("clone3 rule", rc);
  return filter;
}

int main(int argc, char **argv) {
  int print = argc > 1 && strcmp(argv[1], "--print") == 0;
  if (argc < 2) {
    fprintf(stderr, "usage: nestbox-seccomp [--print] PROGRAM [ARG...]\n");
    return 125;
  }
  scmp_filter_ctx filter = build_filter();
  if (print) {
    seccomp_export_pfc(filter, STDOUT_FILENO);
    return 0;
  }
  int rc = seccomp_load(filter);
  if (rc < 0) fail("install the filter", rc);
  seccomp_release(filter);
  if (prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) < 0) fail("drop CAP_SYS_ADMIN", errno);
  execvp(argv[1], argv + 1);
  int failure = errno;
  fprintf(stderr, "nestbox-seccomp: %s: %s\n", argv[1], strerror(failure));
  return failure == ENOENT ? 127 : 126;
}

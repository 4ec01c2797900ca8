/*
 * nestbox-enter: the first step of every workload process the guest agent starts.
 *
 *   nestbox-enter [--cgroup-fd=FD]... [--userns-fd=FD] [--keep-fds=N] OOM_SCORE_ADJ UID GID PROGRAM [ARG...]
 *                                                                                  ("-" = leave as is)
 * In order, in its own process, before PROGRAM runs:
 *   1. join the sandbox's workload cgroup: its own pid is written to every --cgroup-fd, each an
 *      open cgroup.procs file of the `work` group (one per hierarchy), which the launcher opened
 *      on the host and the agent passes down; the guest agent itself stays in the `agent` group.
 *      The sandbox has no writable cgroup file of its own: these descriptors are the only way
 *      in, and they are closed right after. The workload group has the
 *      sandbox's limits minus a reserve for the agent, so a fork bomb or a memory hog hits the
 *      workload limits while the agent keeps memory, pids and CPU share to answer and to kill;
 *   1b. close every descriptor from N on (default 3: only stdio survives). The agent's own
 *      descriptors are close-on-exec, but anything it inherited without that flag, or a
 *      descriptor passed on purpose for this helper's own use, must never reach the workload;
 *      the PTY helper is started with N=5 because fds 3 and 4 are its control and status pipes;
 *   2. raise its oom_score_adj, so under memory pressure the kernel picks workloads first;
 *   2b. with --userns-fd: move into the workloads' user namespace (an open descriptor of it,
 *      made by nestbox-seccomp --agent-uid, which explains why), with the same capability
 *      bounding set as before (joining a user namespace grants every capability in it), then add
 *      a seccomp filter that denies setns altogether, so no workload can move again; the
 *      sandbox-wide filter allows setns into a user namespace only for this step. Ambient
 *      capabilities (the agent's) are cleared;
 *   3. drop to UID/GID (supplementary groups cleared), since only root may do steps 1 and 2.
 *      With --userns-fd, "-" means the agent's effective ids, set as real, effective and saved
 *      ids alike: the agent's real and saved uid are its own and no workload may keep them;
 *   4. exec PROGRAM.
 * Doing this before exec, rather than from the agent after spawning, leaves no window in
 * which the program could fork children that stay in the agent's group.
 * No --cgroup-fd (tests outside a sandbox, other drivers) leaves the cgroup alone.
 * Exit status 127 when PROGRAM is not found, 126 when it cannot run, 125 for our own failures.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/prctl.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/close_range.h>

#define MAX_CGROUP_FDS 16

static void fail(const char *what) {
  fprintf(stderr, "nestbox-enter: %s: %s\n", what, strerror(errno));
  exit(125);
}

static int write_text(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t written = write(fd, text, strlen(text));
  close(fd);
  return written == (ssize_t)strlen(text) ? 0 : -1;
}

static void join_workload_cgroup(const int *fds, int count) {
  char pid[32];
  snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  for (int i = 0; i < count; i++) {
    if (write(fds[i], pid, strlen(pid)) != (ssize_t)strlen(pid)) fail("join the workload cgroup");
    close(fds[i]);
  }
}

/* Step 2b: see the header. */
static void join_workload_namespace(int userns_fd) {
  /* The bounding set as the agent had it, before the namespace hands out every capability. */
  unsigned long long bounding = 0;
  for (int cap = 0; cap <= 63; cap++) {
    int has = prctl(PR_CAPBSET_READ, cap, 0, 0, 0);
    if (has < 0) break; /* past the kernel's last capability */
    if (has) bounding |= 1ULL << cap;
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0) fail("clear ambient capabilities");
  if (setns(userns_fd, CLONE_NEWUSER) < 0) fail("join the workloads' user namespace");
  close(userns_fd);
  scmp_filter_ctx filter = seccomp_init(SCMP_ACT_ALLOW);
  if (!filter) fail("seccomp_init");
  /* Without no_new_privs (libseccomp's default would set it): sudo and other setuid programs
     must keep working; every capability of the namespace just joined lets the kernel take it. */
  int rc = seccomp_attr_set(filter, SCMP_FLTATR_CTL_NNP, 0);
  if (rc == 0) rc = seccomp_rule_add(filter, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(setns), 0);
  if (rc == 0) rc = seccomp_load(filter);
  seccomp_release(filter);
  if (rc < 0) {
    errno = -rc;
    fail("deny setns");
  }
  for (int cap = 0; cap <= 63; cap++) {
    if (bounding & (1ULL << cap)) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) fail("drop a capability");
  }
}

static long parse_id(const char *text, const char *name) {
  if (strcmp(text, "-") == 0) return -1;
  char *end = NULL;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (errno || !end || *end || value < 0) {
    fprintf(stderr, "nestbox-enter: invalid %s \"%s\"\n", name, text);
    exit(125);
  }
  return value;
}

static void usage(void) {
  fprintf(stderr, "usage: nestbox-enter [--cgroup-fd=FD]... [--userns-fd=FD] [--keep-fds=N] OOM_SCORE_ADJ UID GID PROGRAM [ARG...]\n");
  exit(125);
}

int main(int argc, char **argv) {
  unsigned int keep_fds = 3;
  int cgroup_fds[MAX_CGROUP_FDS];
  int cgroup_fd_count = 0;
  int userns_fd = -1;
  while (argc > 1 && strncmp(argv[1], "--", 2) == 0) {
    if (strncmp(argv[1], "--cgroup-fd=", 12) == 0) {
      long fd = parse_id(argv[1] + 12, "--cgroup-fd");
      if (fd < 3 || fd > 1024 || cgroup_fd_count == MAX_CGROUP_FDS) usage();
      cgroup_fds[cgroup_fd_count++] = (int)fd;
    } else if (strncmp(argv[1], "--userns-fd=", 12) == 0) {
      long fd = parse_id(argv[1] + 12, "--userns-fd");
      if (fd < 3 || fd > 1024) usage();
      userns_fd = (int)fd;
    } else if (strncmp(argv[1], "--keep-fds=", 11) == 0) {
      long value = parse_id(argv[1] + 11, "--keep-fds");
      if (value < 3 || value > 64) usage();
      keep_fds = (unsigned int)value;
    } else {
      usage();
    }
    argv++;
    argc--;
  }
  if (argc < 5) usage();
  long uid = parse_id(argv[2], "UID");
  long gid = parse_id(argv[3], "GID");
  join_workload_cgroup(cgroup_fds, cgroup_fd_count);
  if (strcmp(argv[1], "-") != 0) {
    /*
     * This program is execute-only, so the kernel made it non-dumpable and gave its /proc files
     * to the host's root, which even the sandbox's root cannot write. Dumpable again, they are
     * its own; in a sandbox nothing can trace it meanwhile (its real uid is the agent's), and
     * the next change of credentials or the exec below settles dumpability anew.
     */
    if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) < 0) fail("PR_SET_DUMPABLE");
    if (write_text("/proc/self/oom_score_adj", argv[1]) < 0) fail("set oom_score_adj");
  }
  if (userns_fd >= 0) {
    if (userns_fd < (int)keep_fds) usage(); /* never one of the descriptors kept for PROGRAM */
    join_workload_namespace(userns_fd);
    if (uid < 0) uid = (long)geteuid();
    if (gid < 0) gid = (long)getegid();
  }
  if (close_range(keep_fds, ~0U, 0) < 0) fail("close_range");
  if (gid >= 0 || uid >= 0) {
    if (setgroups(0, NULL) < 0 && errno != EPERM) fail("setgroups");
    if (gid >= 0 && setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) < 0) fail("setgid");
    if (uid >= 0 && setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) < 0) fail("setuid");
  }
  execvp(argv[4], argv + 4);
  int failure = errno;
  fprintf(stderr, "%s: %s\n", argv[4], failure == ENOENT ? "command not found" : strerror(failure));
  return failure == ENOENT ? 127 : 126;
}

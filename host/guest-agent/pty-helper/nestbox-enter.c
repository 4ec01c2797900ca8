/*
 * nestbox-enter: the first step of every workload process the guest agent starts.
 *
 *   nestbox-enter [--keep-fds=N] OOM_SCORE_ADJ UID GID PROGRAM [ARG...]   ("-" = leave as is)
 *
 * In order, in its own process, before PROGRAM runs:
 *   0. close every descriptor from N on (default 3: only stdio survives). The agent's own
 *      descriptors are close-on-exec, but anything it inherited without that flag, or a
 *      descriptor passed on purpose for this helper's own use, must never reach the workload;
 *      the PTY helper is started with N=5 because fds 3 and 4 are its control and status pipes;
 *   1. join the sandbox's workload cgroup: its own pid is written to every file matching
 *      "<name>.procs" in /.nestbox/cgroup (the launcher bind-mounts the `work` group's cgroup.procs files
 *      there; the guest agent itself stays in the `agent` group). The workload group has the
 *      sandbox's limits minus a reserve for the agent, so a fork bomb or a memory hog hits the
 *      workload limits while the agent keeps memory, pids and CPU share to answer and to kill;
 *   2. raise its oom_score_adj, so under memory pressure the kernel picks workloads first;
 *   3. drop to UID/GID (supplementary groups cleared), since only root may do steps 1 and 2;
 *   4. exec PROGRAM.
 * Doing this before exec, rather than from the agent after spawning, leaves no window in
 * which the program could fork children that stay in the agent's group.
 * A missing /.nestbox/cgroup directory (tests outside a sandbox, other drivers) is not an error.
 * Exit status 127 when PROGRAM is not found, 126 when it cannot run, 125 for our own failures.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/close_range.h>

#define CGROUP_DIR "/.nestbox/cgroup"

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

static void join_workload_cgroup(void) {
  DIR *dir = opendir(CGROUP_DIR);
  if (!dir) return;
  char pid[32];
  snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  struct dirent *entry;
  while ((entry = readdir(dir)) != NULL) {
    size_t length = strlen(entry->d_name);
    if (length < 6 || strcmp(entry->d_name + length - 6, ".procs") != 0) continue;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", CGROUP_DIR, entry->d_name);
    if (write_text(path, pid) < 0) fail(path);
  }
  closedir(dir);
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
  fprintf(stderr, "usage: nestbox-enter [--keep-fds=N] OOM_SCORE_ADJ UID GID PROGRAM [ARG...]\n");
  exit(125);
}

int main(int argc, char **argv) {
  unsigned int keep_fds = 3;
  while (argc > 1 && strncmp(argv[1], "--", 2) == 0) {
    if (strncmp(argv[1], "--keep-fds=", 11) == 0) {
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
  if (close_range(keep_fds, ~0U, 0) < 0) fail("close_range");
  long uid = parse_id(argv[2], "UID");
  long gid = parse_id(argv[3], "GID");
  join_workload_cgroup();
  if (strcmp(argv[1], "-") != 0) (void)write_text("/proc/self/oom_score_adj", argv[1]);
  if (gid >= 0 || uid >= 0) {
    if (setgroups(0, NULL) < 0 && errno != EPERM) fail("setgroups");
    if (gid >= 0 && setgid((gid_t)gid) < 0) fail("setgid");
    if (uid >= 0 && setuid((uid_t)uid) < 0) fail("setuid");
  }
  execvp(argv[4], argv + 4);
  int failure = errno;
  fprintf(stderr, "%s: %s\n", argv[4], failure == ENOENT ? "command not found" : strerror(failure));
  return failure == ENOENT ? 127 : 126;
}

/*
 * nestbox-rootfs: builds a sandbox's user namespace and its root filesystem. Runs on the host, as
 * root, in the launcher's private mount namespace (stage 2 of host/drivers/local/spawn.ts), with
 * /proc being the sandbox's own PID namespace's procfs.
 *
 *   nestbox-rootfs USERNS_FILE ID_BASE ID_COUNT TARGET DISK_DIR|- LAYER [LAYER...]
 *
 *   1. Creates the sandbox's user namespace: ids 0..ID_COUNT-1 inside are host ids
 *      ID_BASE..ID_BASE+ID_COUNT-1 (uid and gid alike), so root inside is an unprivileged host
 *      user of its own. A short-lived child creates it; we write its maps (a map this wide needs
 *      CAP_SETUID/CAP_SETGID in the parent namespace, which only we hold), then bind-mount its
 *      nsfs file onto USERNS_FILE, which keeps the namespace alive after the child exits and
 *      lets the launcher's last stage join it (setns).
 *   2. Makes an idmapped clone of every layer (open_tree + mount_setattr(MOUNT_ATTR_IDMAP)) with
 *      that namespace's mapping: a file that is uid 0 on disk is host uid ID_BASE through the
 *      clone, i.e. root inside the sandbox, and what the sandbox writes as its root lands on
 *      disk as uid 0 again. The disk keeps unshifted ids, so snapshots, forks and file views
 *      work across sandboxes with different ranges, and no file is ever chowned.
 *   3. Mounts overlayfs at TARGET from those clones, handing the layers over as file
 *      descriptors (fsconfig FSCONFIG_SET_FD): DISK_DIR/upper and DISK_DIR/work (one clone of
 *      DISK_DIR: overlayfs wants both on one mount), then the LAYERs, topmost first, as lower
 *      layers. DISK_DIR "-" makes a read-only root of the LAYERs alone (file views).
 *      Because the layers are detached mounts, /proc/self/mountinfo inside the sandbox shows no
 *      host path for them.
 *
 *   nestbox-rootfs --volume USERNS_FILE ID_BASE TARGET SOURCE SUBPATH|- MOUNTPATH ro|rw
 *
 *   Mounts a volume (issue 19) into the root built above, after it: an idmapped clone (the
 *   sandbox's mapping, so volume files keep unshifted ids on disk and every sandbox sharing the
 *   volume sees them as its own) of SOURCE, or of SOURCE/SUBPATH, at TARGET/MOUNTPATH, nosuid,
 *   nodev, read-only for `ro`. Both SUBPATH and MOUNTPATH are walked one component at a time
 *   with O_NOFOLLOW from a descriptor of their base (missing directories are made): the volume
 *   and the sandbox's disk are written by sandboxes, so a symlink or `..` in either must never
 *   lead the mount to a host path. The mount is attached by descriptor (move_mount
 *   MOVE_MOUNT_T_EMPTY_PATH), never by a path lookup.
 * Exit status 0 on success, 1 on failure (with a message on stderr).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <linux/securebits.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void fail(const char *what, const char *detail) {
  fprintf(stderr, "nestbox-rootfs: %s%s%s: %s\n", what, detail ? " " : "", detail ? detail : "", strerror(errno));
  exit(1);
}

static long parse_number(const char *text, const char *name) {
  char *end = NULL;
  errno = 0;
  long value = strtol(text, &end, 10);
  if (errno || !end || *end || value < 0 || value > 0xffffffffL) {
    fprintf(stderr, "nestbox-rootfs: invalid %s \"%s\"\n", name, text);
    exit(1);
  }
  return value;
}

static void write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) fail("open", path);
  if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) fail("write", path);
  close(fd);
}

/* Step 1: returns an fd of the new user namespace and pins it on userns_file. */
static int create_user_namespace(const char *userns_file, long base, long count) {
  int ready[2], done[2];
  if (pipe2(ready, O_CLOEXEC) < 0 || pipe2(done, O_CLOEXEC) < 0) fail("pipe", NULL);
  pid_t child = fork();
  if (child < 0) fail("fork", NULL);
  if (child == 0) {
    char byte = 'u';
    if (unshare(CLONE_NEWUSER) < 0) _exit(1);
    if (write(ready[1], &byte, 1) != 1) _exit(1);
    /* Stay until the parent has what it needs (it closes its end of `done`). */
    close(done[1]);
    ssize_t ignored = read(done[0], &byte, 1);
    (void)ignored;
    _exit(0);
  }
  close(ready[1]);
  close(done[0]);
  char byte;
  if (read(ready[0], &byte, 1) != 1) {
    errno = ECHILD;
    fail("create the user namespace", NULL);
  }
  char path[64], map[96];
  snprintf(map, sizeof map, "0 %ld %ld\n", base, count);
  snprintf(path, sizeof path, "/proc/%d/uid_map", (int)child);
  write_file(path, map);
  snprintf(path, sizeof path, "/proc/%d/gid_map", (int)child);
  write_file(path, map);
  snprintf(path, sizeof path, "/proc/%d/ns/user", (int)child);
  int userns = open(path, O_RDONLY | O_CLOEXEC);
  if (userns < 0) fail("open", path);
  if (mount(path, userns_file, NULL, MS_BIND, NULL) < 0) fail("pin the user namespace on", userns_file);
  close(done[1]);
  int status;
  if (waitpid(child, &status, 0) < 0) fail("waitpid", NULL);
  return userns;
}

/* Step 2: a detached, idmapped clone of the tree at path. */
static int idmapped_clone(const char *path, int userns, int read_only) {
  int tree = (int)syscall(SYS_open_tree, AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW);
  if (tree < 0) fail("open_tree", path);
  struct mount_attr attr = {0};
  attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NODEV | (read_only ? MOUNT_ATTR_RDONLY : 0);
  attr.userns_fd = (unsigned long long)userns;
  if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0) fail("idmap", path);
  return tree;
}

static void set_fd(int fs, const char *key, int fd, const char *label) {
  if (fsconfig(fs, FSCONFIG_SET_FD, key, NULL, fd) < 0) fail("overlay layer", label);
}

/*
 * Walks `path` (slash-separated, relative) below `base` without following any symlink, making
 * missing directories (`mode`, with the current file-system ids; set through the held descriptor,
 * so no umask and no swapped-in symlink applies). Returns an O_PATH descriptor of the last
 * directory. "." and ".." are refused.
 */
static int walk_below(int base, const char *path, const char *label, mode_t mode) {
  char buffer[4096];
  if (strlen(path) >= sizeof buffer) {
    errno = ENAMETOOLONG;
    fail("path too long:", label);
  }
  strcpy(buffer, path);
  int dir = dup(base);
  if (dir < 0) fail("dup", label);
  char *save = NULL;
  for (char *part = strtok_r(buffer, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
    if (strcmp(part, ".") == 0 || strcmp(part, "..") == 0) {
      errno = EINVAL;
      fail("'.' or '..' in", label);
    }
    int next = openat(dir, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0 && errno == ENOENT) {
      int made = mkdirat(dir, part, 0700) == 0;
      if (!made && errno != EEXIST) fail("mkdir in", label);
      next = openat(dir, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (next >= 0 && made) {
        char self[64];
        snprintf(self, sizeof self, "/proc/self/fd/%d", next);
        if (chmod(self, mode) < 0) fail("chmod in", label);
      }
    }
    /* ENOTDIR/ELOOP: a file or a symlink where a directory is wanted. */
    if (next < 0) fail("open (not a directory, or a symlink)", label);
    close(dir);
    dir = next;
  }
  return dir;
}

static int mount_volume(int argc, char **argv) {
  if (argc != 9) {
    fprintf(stderr, "usage: nestbox-rootfs --volume USERNS_FILE ID_BASE TARGET SOURCE SUBPATH|- MOUNTPATH ro|rw\n");
    return 1;
  }
  const char *userns_file = argv[2];
  long base = parse_number(argv[3], "ID_BASE");
  const char *target = argv[4], *source = argv[5], *subpath = argv[6], *mount_path = argv[7];
  int read_only = strcmp(argv[8], "ro") == 0;
  if (!read_only && strcmp(argv[8], "rw") != 0) {
    fprintf(stderr, "nestbox-rootfs: mode must be ro or rw\n");
    return 1;
  }
  if (base < 1) {
    fprintf(stderr, "nestbox-rootfs: the id range must be above host root\n");
    return 1;
  }
  /* Refused here too (the driver refuses them first): those are the launcher's own mounts. */
  const char *reserved[] = {"proc", "sys", "dev", ".nestbox"};
  const char *first = mount_path;
  while (*first == '/') first++;
  if (!*first) {
    fprintf(stderr, "nestbox-rootfs: a volume cannot be mounted at /\n");
    return 1;
  }
  for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++) {
    size_t n = strlen(reserved[i]);
    if (strncmp(first, reserved[i], n) == 0 && (first[n] == '/' || first[n] == 0)) {
      fprintf(stderr, "nestbox-rootfs: /%s is reserved\n", reserved[i]);
      return 1;
    }
  }
  int userns = open(userns_file, O_RDONLY | O_CLOEXEC);
  if (userns < 0) fail("open", userns_file);
  int volume = open(source, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (volume < 0) fail("open volume", source);
  /* The subpath as host root: the volume's own files are unshifted (uid 0 = the sandbox's root). */
  /* Subpaths made here are open to every user of the sandbox, like the volume's top (0777). */
  int from = strcmp(subpath, "-") == 0 ? volume : walk_below(volume, subpath, "volume subpath", 0777);
  int tree = (int)syscall(SYS_open_tree, from, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
  if (tree < 0) fail("open_tree", source);
  struct mount_attr attr = {0};
  attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID | (read_only ? MOUNT_ATTR_RDONLY : 0);
  attr.userns_fd = (unsigned long long)userns;
  if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0) fail("idmap", source);
  /* The mount point is made in the sandbox's root as the sandbox's root (see main). */
  if (prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) < 0) fail("keep capabilities across setfsuid", NULL);
  setfsgid((gid_t)base);
  setfsuid((uid_t)base);
  int root = open(target, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (root < 0) fail("open", target);
  int at = walk_below(root, mount_path, "mount path", 0755);
  if (move_mount(tree, "", at, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0) fail("move_mount to", mount_path);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--volume") == 0) return mount_volume(argc, argv);
  if (argc < 7) {
    fprintf(stderr, "usage: nestbox-rootfs USERNS_FILE ID_BASE ID_COUNT TARGET DISK_DIR|- LAYER [LAYER...]\n");
    return 1;
  }
  const char *userns_file = argv[1];
  long base = parse_number(argv[2], "ID_BASE");
  long count = parse_number(argv[3], "ID_COUNT");
  const char *target = argv[4];
  const char *disk_dir = argv[5];
  int read_only = strcmp(disk_dir, "-") == 0;
  if (count < 1 || base < 1) {
    fprintf(stderr, "nestbox-rootfs: the id range must be above host root and not empty\n");
    return 1;
  }

  int userns = create_user_namespace(userns_file, base, count);
  /*
   * overlayfs works on its layers with the credentials of whoever created it. Through the
   * idmapped clones host uid 0 has no on-disk id at all (EOVERFLOW), so the overlay is created
   * with file-system ids of the sandbox's root (host ID_BASE) while keeping every capability:
   * SECBIT_NO_SETUID_FIXUP stops setfsuid from clearing them.
   */
  if (prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) < 0) fail("keep capabilities across setfsuid", NULL);
  setfsgid((gid_t)base);
  setfsuid((uid_t)base);
  if ((long)setfsuid((uid_t)-1) != base || (long)setfsgid((gid_t)-1) != base) {
    errno = EPERM;
    fail("switch file-system ids", NULL);
  }
  int fs = fsopen("overlay", FSOPEN_CLOEXEC);
  if (fs < 0) fail("fsopen overlay", NULL);
  if (!read_only) {
    int disk = idmapped_clone(disk_dir, userns, 0);
    int upper = openat(disk, "upper", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (upper < 0) fail("open upper dir in", disk_dir);
    int work = openat(disk, "work", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (work < 0) fail("open work dir in", disk_dir);
    set_fd(fs, "upperdir", upper, "upper");
    set_fd(fs, "workdir", work, "work");
  }
  for (int i = 6; i < argc; i++) set_fd(fs, "lowerdir+", idmapped_clone(argv[i], userns, 1), argv[i]);
  if (fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) fail("create the overlay", NULL);
  /* nodev: a device node in any layer (an OCI image's, say) opens nothing; /dev is a tmpfs of its own. */
  int root = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NODEV | (read_only ? MOUNT_ATTR_RDONLY : 0));
  if (root < 0) fail("fsmount", NULL);
  if (move_mount(root, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) < 0) fail("move_mount to", target);
  return 0;
}

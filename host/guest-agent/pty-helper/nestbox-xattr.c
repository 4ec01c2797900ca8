/*
 * The file-metadata mode of nestbox-pty: user extended attributes for the guest agent.
 *
 * Why here: Node has no xattr API, and the sandbox image may not have getfattr/setfattr (a user's
 * OCI image rarely does). nestbox-pty is already a static binary mounted read-only into every
 * sandbox (/.nestbox/bin/nestbox-pty), so this mode rides along in it (linked from this file)
 * rather than needing a binary, a mount and an image step of its own.
 *
 *   nestbox-pty --xattr get
 *     stdin: paths, each ended by a NUL byte. stdout: one line per path, in order: its `user.*`
 *     attributes (symlinks followed) as space-separated `HEXNAME=HEXVALUE` pairs (the name
 *     without `user.`), or an empty line when it has none, does not exist, or its filesystem
 *     keeps no user attributes; `!ERRNO` for any other failure.
 *   nestbox-pty --xattr set PATH PREFIX
 *     stdin: lines `HEXNAME=HEXVALUE` (names without `user.`). Sets each `user.NAME`; with a
 *     non-empty PREFIX, first removes every existing `user.PREFIX*` attribute not among them
 *     (so the set under PREFIX is replaced). Exit 0, or 1 with "errno N: message" on stderr.
 *
 * Hex keeps names and values byte-exact through a line protocol with no escaping rules.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

#define USER_PREFIX "user."
#define MAX_LIST 65536
#define MAX_VALUE 65536
#define MAX_LINE (2 * (255 + MAX_VALUE) + 8)

static void put_hex(const unsigned char *bytes, size_t length) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < length; i++) {
    putchar(digits[bytes[i] >> 4]);
    putchar(digits[bytes[i] & 15]);
  }
}

static int hex_value(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Decodes `length` hex digits in place; returns the byte count or -1. */
static long from_hex(char *text, size_t length) {
  if (length % 2) return -1;
  for (size_t i = 0; i < length / 2; i++) {
    int high = hex_value((unsigned char)text[2 * i]), low = hex_value((unsigned char)text[2 * i + 1]);
    if (high < 0 || low < 0) return -1;
    text[i] = (char)(high * 16 + low);
  }
  return (long)(length / 2);
}

static int quiet_errno(int error) {
  return error == ENOENT || error == ENOTDIR || error == ENOTSUP || error == EOPNOTSUPP || error == ENODATA;
}

static void get_one(const char *path) {
  static char names[MAX_LIST];
  static unsigned char value[MAX_VALUE];
  ssize_t length = listxattr(path, names, sizeof names);
  if (length < 0) {
    if (quiet_errno(errno)) putchar('\n');
    else printf("!%d\n", errno);
    return;
  }
  int first = 1;
  for (ssize_t offset = 0; offset < length; offset += (ssize_t)strlen(names + offset) + 1) {
    const char *name = names + offset;
    if (strncmp(name, USER_PREFIX, strlen(USER_PREFIX)) != 0) continue;
    ssize_t size = getxattr(path, name, value, sizeof value);
    if (size < 0) continue; /* removed meanwhile, or too large to report */
    if (!first) putchar(' ');
    first = 0;
    const char *short_name = name + strlen(USER_PREFIX);
    put_hex((const unsigned char *)short_name, strlen(short_name));
    putchar('=');
    put_hex(value, (size_t)size);
  }
  putchar('\n');
}

static int get_all(void) {
  char *path = NULL;
  size_t capacity = 0;
  ssize_t length;
  while ((length = getdelim(&path, &capacity, '\0', stdin)) > 0) {
    if (path[length - 1] != '\0') break; /* a truncated last path: ignored */
    get_one(path);
  }
  free(path);
  return fflush(stdout) == 0 ? 0 : 1;
}

static int fail(const char *what) {
  fprintf(stderr, "errno %d: %s: %s\n", errno, what, strerror(errno));
  return 1;
}

struct pair {
  char name[256 + sizeof USER_PREFIX];
  char *value;
  long value_length;
};

static int set_all(const char *path, const char *prefix) {
  struct pair *pairs = NULL;
  size_t count = 0;
  char *line = NULL;
  size_t capacity = 0;
  ssize_t length;
  while ((length = getline(&line, &capacity, stdin)) > 0) {
    if (line[length - 1] == '\n') line[--length] = '\0';
    if (length == 0) continue;
    char *equals = strchr(line, '=');
    if (!equals || length > MAX_LINE) {
      errno = EINVAL;
      return fail("malformed input line");
    }
    long name_length = from_hex(line, (size_t)(equals - line));
    long value_length = from_hex(equals + 1, strlen(equals + 1));
    if (name_length <= 0 || name_length > 255 || value_length < 0) {
      errno = EINVAL;
      return fail("malformed name or value");
    }
    struct pair *grown = realloc(pairs, (count + 1) * sizeof *pairs);
    if (!grown) return fail("realloc");
    pairs = grown;
    snprintf(pairs[count].name, sizeof pairs[count].name, "%s%.*s", USER_PREFIX, (int)name_length, line);
    pairs[count].value = malloc((size_t)value_length + 1);
    if (!pairs[count].value) return fail("malloc");
    memcpy(pairs[count].value, equals + 1, (size_t)value_length);
    pairs[count].value_length = value_length;
    count++;
  }
  free(line);

  if (prefix[0] != '\0') {
    static char names[MAX_LIST];
    char full_prefix[300];
    snprintf(full_prefix, sizeof full_prefix, "%s%s", USER_PREFIX, prefix);
    ssize_t listed = listxattr(path, names, sizeof names);
    if (listed < 0 && !(errno == ENOTSUP || errno == EOPNOTSUPP)) return fail("listxattr");
    for (ssize_t offset = 0; listed > 0 && offset < listed; offset += (ssize_t)strlen(names + offset) + 1) {
      const char *name = names + offset;
      if (strncmp(name, full_prefix, strlen(full_prefix)) != 0) continue;
      int kept = 0;
      for (size_t i = 0; i < count && !kept; i++) kept = strcmp(pairs[i].name, name) == 0;
      if (!kept && removexattr(path, name) < 0 && errno != ENODATA) return fail("removexattr");
    }
  }
  for (size_t i = 0; i < count; i++) {
    if (setxattr(path, pairs[i].name, pairs[i].value, (size_t)pairs[i].value_length, 0) < 0) return fail("setxattr");
  }
  return 0;
}

int xattr_main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "get") == 0) return get_all();
  if (argc == 4 && strcmp(argv[1], "set") == 0) return set_all(argv[2], argv[3]);
  fprintf(stderr, "usage: nestbox-pty --xattr get | --xattr set PATH PREFIX\n");
  return 125;
}

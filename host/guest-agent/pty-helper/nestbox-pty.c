/*
 * nestbox-pty: runs one command on a fresh pseudo-terminal for the guest agent.
 *
 * Why a helper of our own: Node cannot allocate a PTY without native code. node-pty would need
 * its npm install script approved and a native module compiled for, and mounted into, every
 * sandbox image. This file is built once with `cc -static` and bind-mounted read-only at
 * /.nestbox/bin/nestbox-pty like tini, so it works in any image (even without a libc).
 *
 *   nestbox-pty COLS ROWS OOM_SCORE_ADJ PROGRAM [ARG...]
 *   nestbox-pty --xattr …   (file metadata for the agent: nestbox-xattr.c)
 *
 *   fd 0  terminal input from the agent (raw bytes, written to the master unmodified)
 *   fd 1  terminal output to the agent (raw bytes read from the master, unmodified)
 *   fd 2  the helper's own diagnostics
 *   fd 3  control from the agent: 4-byte records, big-endian uint16 cols then uint16 rows
 *         (each record resizes the terminal; the kernel sends SIGWINCH to the foreground group)
 *   fd 4  status to the agent, text lines: "pid <n>" once the command is forked, then
 *         "exit <code>" or "signal <number>" when it has ended and its output was relayed.
 *
 * The command runs as a session leader with the terminal as its controlling tty (setsid +
 * TIOCSCTTY), so its session id and process group id are its pid: the agent signals -pid.
 * OOM_SCORE_ADJ ("-" to skip) is written to /proc/self/oom_score_adj before forking, so the
 * command inherits it with no window in which it could fork unadjusted children.
 * When the command exits, the helper drains what the terminal still holds (bounded, because
 * background jobs may keep writing), reports the status and exits itself; it never waits for
 * every holder of the terminal to go away.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#define IO_BUFFER 65536
#define DRAIN_LIMIT (4 * 1024 * 1024)
#define DRAIN_QUIET_MS 50

static int child_signal_pipe[2] = {-1, -1};

static void on_sigchld(int signo) {
  (void)signo;
  int saved = errno;
  ssize_t ignored = write(child_signal_pipe[1], "c", 1);
  (void)ignored;
  errno = saved;
}

static void die(const char *what) {
  fprintf(stderr, "nestbox-pty: %s: %s\n", what, strerror(errno));
  exit(125);
}

static int parse_size(const char *text, const char *name) {
  char *end = NULL;
  long value = strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > 65535) {
    fprintf(stderr, "nestbox-pty: %s must be an integer from 1 to 65535\n", name);
    exit(125);
  }
  return (int)value;
}

static int write_all(int fd, const char *data, size_t length) {
  while (length > 0) {
    ssize_t written = write(fd, data, length);
    if (written < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    data += written;
    length -= (size_t)written;
  }
  return 0;
}

static void report(const char *kind, long value) {
  char line[64];
  int length = snprintf(line, sizeof line, "%s %ld\n", kind, value);
  (void)write_all(4, line, (size_t)length);
}

static void set_size(int master, int cols, int rows) {
  struct winsize size;
  memset(&size, 0, sizeof size);
  size.ws_col = (unsigned short)cols;
  size.ws_row = (unsigned short)rows;
  (void)ioctl(master, TIOCSWINSZ, &size);
}

static void set_oom_score_adj(const char *value) {
  if (strcmp(value, "-") == 0) return;
  int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)write_all(fd, value, strlen(value));
  close(fd);
}

/* In the child: become a session leader on the terminal, then exec. Never returns. */
static void run_command(const char *slave_name, char **argv) {
  if (setsid() < 0) die("setsid");
  int slave = open(slave_name, O_RDWR);
  if (slave < 0) die("open the terminal");
  if (ioctl(slave, TIOCSCTTY, 0) < 0) die("TIOCSCTTY");
  if (dup2(slave, 0) < 0 || dup2(slave, 1) < 0 || dup2(slave, 2) < 0) die("dup2");
  if (slave > 2) close(slave);
  close(3);
  close(4);
  /* The helper ignores SIGPIPE and catches SIGCHLD; the command starts with defaults. */
  signal(SIGPIPE, SIG_DFL);
  signal(SIGCHLD, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  execvp(argv[0], argv);
  int failure = errno;
  fprintf(stderr, "%s: %s\n", argv[0], failure == ENOENT ? "command not found" : strerror(failure));
  _exit(failure == ENOENT ? 127 : 126);
}

/*
 * Relays what the terminal still holds after the command exited. The kernel moves slave
 * writes to the master asynchronously, so "nothing to read" is only believed after a short
 * quiet period. Bounded, because background jobs may keep writing forever.
 */
static void drain_master(int master) {
  static char buffer[IO_BUFFER];
  size_t relayed = 0;
  while (relayed < DRAIN_LIMIT) {
    struct pollfd pfd = {.fd = master, .events = POLLIN};
    int ready = poll(&pfd, 1, DRAIN_QUIET_MS);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return;
    ssize_t got = read(master, buffer, sizeof buffer);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return;
    (void)write_all(1, buffer, (size_t)got);
    relayed += (size_t)got;
  }
}

/* nestbox-xattr.c: the file-metadata mode, linked into this binary (see there why). */
int xattr_main(int argc, char **argv);

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "--xattr") == 0) return xattr_main(argc - 1, argv + 1);
  if (argc < 5) {
    fprintf(stderr, "usage: nestbox-pty COLS ROWS OOM_SCORE_ADJ PROGRAM [ARG...]\n");
    return 125;
  }
  int cols = parse_size(argv[1], "COLS");
  int rows = parse_size(argv[2], "ROWS");
  set_oom_score_adj(argv[3]);

  signal(SIGPIPE, SIG_IGN);
  if (pipe2(child_signal_pipe, O_CLOEXEC | O_NONBLOCK) < 0) die("pipe2");
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = on_sigchld;
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGCHLD, &action, NULL) < 0) die("sigaction");

  int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) die("posix_openpt");
  if (grantpt(master) < 0) die("grantpt");
  if (unlockpt(master) < 0) die("unlockpt");
  char *slave_name = ptsname(master);
  if (!slave_name) die("ptsname");
  set_size(master, cols, rows);
  /*
   * The helper keeps the slave open itself: otherwise the master reports a hangup before the
   * child has opened it, and again whenever no process holds it. The command's exit, not the
   * terminal's hangup, is what ends the helper.
   */
  int slave_keepalive = open(slave_name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave_keepalive < 0) die("open the terminal");

  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) run_command(slave_name, argv + 4);
  report("pid", (long)child);
  fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);

  static char output[IO_BUFFER];
  static char input[IO_BUFFER];
  size_t input_length = 0, input_start = 0;
  unsigned char control[4];
  size_t control_length = 0;
  int input_open = 1, control_open = 1, output_open = 1;

  for (;;) {
    struct pollfd fds[4];
    int count = 0;
    int master_index = -1, input_index = -1, control_index = -1;
    fds[count].fd = child_signal_pipe[0];
    fds[count++].events = POLLIN;
    short master_events = 0;
    if (output_open) master_events |= POLLIN;
    if (input_length > input_start) master_events |= POLLOUT;
    if (master_events) {
      master_index = count;
      fds[count].fd = master;
      fds[count++].events = master_events;
    }
    /* Read more input only once the previous input reached the terminal: bounded memory. */
    if (input_open && input_length == input_start) {
      input_index = count;
      fds[count].fd = 0;
      fds[count++].events = POLLIN;
    }
    if (control_open) {
      control_index = count;
      fds[count].fd = 3;
      fds[count++].events = POLLIN;
    }
    if (poll(fds, (nfds_t)count, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }

    if (master_index >= 0 && (fds[master_index].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t got = read(master, output, sizeof output);
      if (got > 0) {
        (void)write_all(1, output, (size_t)got);
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        output_open = 0;
      }
    }
    if (master_index >= 0 && (fds[master_index].revents & POLLOUT) && input_length > input_start) {
      ssize_t written = write(master, input + input_start, input_length - input_start);
      if (written > 0) input_start += (size_t)written;
      else if (written < 0 && errno != EAGAIN && errno != EINTR) input_start = input_length;
      if (input_start == input_length) input_start = input_length = 0;
    }
    if (input_index >= 0 && (fds[input_index].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t got = read(0, input, sizeof input);
      if (got > 0) {
        input_start = 0;
        input_length = (size_t)got;
      } else if (got == 0 || errno != EINTR) {
        /* The agent closed terminal input: stop reading it, the command keeps running. */
        input_open = 0;
        close(0);
      }
    }
    if (control_index >= 0 && (fds[control_index].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t got = read(3, control + control_length, sizeof control - control_length);
      if (got > 0) {
        control_length += (size_t)got;
        if (control_length == sizeof control) {
          set_size(master, (control[0] << 8) | control[1], (control[2] << 8) | control[3]);
          control_length = 0;
        }
      } else if (got == 0 || errno != EINTR) {
        control_open = 0;
      }
    }
    if (fds[0].revents & POLLIN) {
      char sink[64];
      while (read(child_signal_pipe[0], sink, sizeof sink) > 0) {
      }
      int status;
      pid_t reaped = waitpid(child, &status, WNOHANG);
      if (reaped == child) {
        if (output_open) drain_master(master);
        if (WIFSIGNALED(status)) {
          report("signal", WTERMSIG(status));
          return 128 + WTERMSIG(status);
        }
        report("exit", WEXITSTATUS(status));
        return WEXITSTATUS(status);
      }
    }
  }
}

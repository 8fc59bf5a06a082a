/*
 * capsule-agent: the resident process of a durable sandbox.
 *
 * The host talks to it only over its stdin (commands) and stdout (events); stderr is for
 * diagnostics. It starts, supervises and streams the sandbox's processes from one poll loop.
 * Wire format (both directions, big-endian): u8 type, u32 id, u32 length, payload[length].
 * See src/backends/agent/protocol.ts for the host side of the same protocol.
 *
 * It must stay tiny when idle: no timers, no allocation unless a frame arrives or a child
 * writes, buffers live in BSS so untouched pages cost nothing.
 *
 * The host is a supervisor (capsule-launch --supervise) that outlives the Capsule server: a new
 * server asks LIST for the processes running (and the last ones that ended), each with the label
 * the host gave it at START, and takes them over. QUIT ends the sandbox's work; end of file on
 * stdin (the supervisor is gone) does too.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HEADER_BYTES 9
#define MAX_PAYLOAD (1u << 20)
#define OUTPUT_CHUNK (64u * 1024u)
#define EXIT_PROTOCOL 70 /* EX_SOFTWARE: the host broke the protocol */
#define SHUTDOWN_REAP_MS 2000
#define DEFAULT_PATH "/usr/local/bin:/usr/bin:/bin"
#define MAX_LABEL 16384 /* the host's own record of a process, echoed by LIST */
#define ENDED_KEPT 32   /* ended processes LIST still reports, newest last */

#include "agent-relay.h"
#include "agent-users.h"

struct proc {
  uint32_t id;
  pid_t pid;
  int out_fd;          /* stdout pipe read end, or the pty master */
  int err_fd;          /* stderr pipe read end; -1 for a pty */
  int in_fd;           /* stdin pipe write end, or a dup of the pty master; -1 when none */
  int is_pty;
  int close_after;     /* CLOSE_STDIN arrived while input was still queued */
  unsigned char *pending; /* input the child has not accepted yet: pending[pending_off..len) */
  size_t pending_off, pending_len, pending_cap;
  unsigned char *label;   /* opaque bytes from START's 'l' record; NULL when none */
  uint32_t label_len;
};

/* A process that ended: what LIST says of it until ENDED_KEPT newer ones ended. */
struct ended {
  uint32_t id;
  pid_t pid;
  unsigned char flags, kind;
  uint32_t value;
  unsigned char *label;
  uint32_t label_len;
};
static struct ended ended_ring[ENDED_KEPT];
static size_t ended_next, ended_count;

static struct proc **procs;
static size_t nprocs, procs_cap;
static struct pollfd *pfds;
static struct proc **pfd_owner;
static size_t pfds_cap; /* entries of pfds and pfd_owner */
static int sigfd = -1;

/* Whole pages, page-aligned, so a burst's pages can be handed back (see read_host) without
 * madvise touching the variables next to it. */
#define INBUF_BYTES (MAX_PAYLOAD + 4096)
static unsigned char inbuf[INBUF_BYTES] __attribute__((aligned(4096)));
static size_t inlen, inbuf_high;
static unsigned char outbuf[OUTPUT_CHUNK];

static void kill_all(void);

static void diag(const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n > sizeof line - 2) n = sizeof line - 2;
  line[n++] = '\n';
  ssize_t ignored = write(2, line, (size_t)n);
  (void)ignored;
}

/* The host broke the protocol: nothing it sends can be trusted any more. */
static void die_protocol(const char *msg) {
  diag("capsule-agent: %s; exiting", msg);
  kill_all();
  _exit(EXIT_PROTOCOL);
}

static void put_u32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
  p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static int set_nonblock(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

/* One writer for stdout, whole frames only, so frames never interleave. If the host has gone
 * (EPIPE), there is nobody left to supervise for: kill everything and leave. */
static void send_frame(char type, uint32_t id, const void *a, size_t alen, const void *b, size_t blen) {
  unsigned char hdr[HEADER_BYTES];
  hdr[0] = (unsigned char)type;
  put_u32(hdr + 1, id);
  put_u32(hdr + 5, (uint32_t)(alen + blen));
  struct iovec iov[3] = {{hdr, HEADER_BYTES}, {(void *)a, alen}, {(void *)b, blen}};
  struct iovec *v = iov;
  int cnt = 3;
  while (cnt > 0) {
    ssize_t n = writev(1, v, cnt);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) { /* stdout was handed to us non-blocking: wait, do not spin */
        struct pollfd p = {.fd = 1, .events = POLLOUT};
        (void)poll(&p, 1, -1);
        continue;
      }
      diag("capsule-agent: writing to host failed: %s", strerror(errno));
      kill_all();
      _exit(0);
    }
    while (cnt > 0 && (size_t)n >= v->iov_len) { n -= (ssize_t)v->iov_len; v++; cnt--; }
    if (cnt > 0) { v->iov_base = (char *)v->iov_base + n; v->iov_len -= (size_t)n; }
  }
}

static struct proc *find_proc(uint32_t id) {
  for (size_t i = 0; i < nprocs; i++)
    if (procs[i]->id == id) return procs[i];
  return NULL;
}

/* Signal the whole tree: the process group of the session leader, plus every process whose
 * session id is the leader's pid (a grandchild may have moved to its own process group). */
static void signal_tree(pid_t leader, int sig) {
  (void)kill(-leader, sig);
  DIR *d = opendir("/proc");
  if (d == NULL) return;
  struct dirent *e;
  char path[64], stat[512];
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    pid_t pid = (pid_t)atoi(e->d_name);
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, stat, sizeof stat - 1);
    close(fd);
    if (n <= 0) continue;
    stat[n] = '\0';
    /* "pid (comm) state ppid pgrp session ...": comm may hold spaces and ')' so parse after
     * the last ')'. */
    char *p = strrchr(stat, ')');
    int ppid, pgrp, session;
    char state;
    if (p == NULL || sscanf(p + 1, " %c %d %d %d", &state, &ppid, &pgrp, &session) != 4) continue;
    /* The group kill above already reached the leader's process group: signal only members of
     * the session that moved to another group, so nobody gets the signal twice (a second SIGINT
     * would end a REPL that handles the first). */
    if (session == leader && pgrp != leader) (void)kill(pid, sig);
  }
  closedir(d);
}

static void kill_all(void) {
  for (size_t i = 0; i < nprocs; i++) signal_tree(procs[i]->pid, SIGKILL);
}

/* ---- the child side of START: runs between vfork and exec, reports failure on status_fd ----
 * The child borrows the agent's memory until it execs or exits (vfork), so it only makes system
 * calls: no allocation, no stdio, no strerror. A failure is written as the errno (4 bytes) and
 * "what\0arg"; the agent formats the message. */

static void child_fail(int status_fd, int err, const char *what, const char *arg) {
  unsigned char e[4];
  put_u32(e, (uint32_t)err);
  size_t wl = strlen(what), al = strlen(arg);
  if (wl > 64) wl = 64;
  if (al > 512) al = 512;
  char nul = '\0';
  struct iovec iov[4] = {{e, 4}, {(void *)what, wl}, {&nul, 1}, {(void *)arg, al}};
  ssize_t ignored = writev(status_fd, iov, 4); /* < PIPE_BUF: one atomic write */
  (void)ignored;
  _exit(127);
}

/* execvpe(3) semantics with the child's own PATH, not the agent's. ENOEXEC scripts without a
 * shebang are not retried with /bin/sh: sandboxed programs name their interpreter. */
static void child_exec(int status_fd, char **argv, char **envp) {
  const char *file = argv[0];
  if (strchr(file, '/') != NULL) {
    execve(file, argv, envp);
    child_fail(status_fd, errno, "exec", file);
  }
  const char *path = DEFAULT_PATH;
  for (char **e = envp; *e != NULL; e++)
    if (strncmp(*e, "PATH=", 5) == 0) { path = *e + 5; break; }
  int err = ENOENT, seen_eacces = 0;
  size_t flen = strlen(file);
  char full[4096];
  for (const char *p = path;; ) {
    const char *end = strchrnul(p, ':');
    size_t dlen = (size_t)(end - p);
    if (dlen + flen + 2 <= sizeof full) {
      if (dlen == 0) { full[0] = '.'; dlen = 1; } else memcpy(full, p, dlen);
      full[dlen] = '/';
      memcpy(full + dlen + 1, file, flen + 1);
      execve(full, argv, envp);
      err = errno;
      if (err == EACCES) seen_eacces = 1;
      else if (err != ENOENT && err != ENOTDIR && err != ESTALE && err != ENODEV && err != ETIMEDOUT)
        child_fail(status_fd, err, "exec", file);
    }
    if (*end == '\0') break;
    p = end + 1;
  }
  child_fail(status_fd, seen_eacces ? EACCES : ENOENT, "exec", file);
}

struct start_req {
  char **argv, **envp;
  const char *cwd;
  const char *user;        /* 'u' record: run as this user ("name", "uid", "uid:gid") */
  struct agent_user who;   /* resolved before vfork */
  int stdin_pipe, is_pty;
  unsigned short cols, rows;
  const unsigned char *label; /* points into the START payload */
  uint32_t label_len;
};

static void child_main(int status_fd, const struct start_req *r, int in_r, int out_w, int err_w, int slave) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL); /* SIGPIPE was ignored; exec keeps that */
  if (setsid() < 0) child_fail(status_fd, errno, "setsid", "");
  if (r->is_pty) {
    if (ioctl(slave, TIOCSCTTY, 0) < 0) child_fail(status_fd, errno, "ioctl", "TIOCSCTTY");
    in_r = out_w = err_w = slave;
  } else if (!r->stdin_pipe) {
    in_r = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in_r < 0) child_fail(status_fd, errno, "open", "/dev/null");
  }
  /* dup2 clears CLOEXEC on 0/1/2; every other fd the agent holds is CLOEXEC and goes at exec. */
  if (dup2(in_r, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
    child_fail(status_fd, errno, "dup2", "stdio");
  if (r->user != NULL) {
    int err = agent_user_become(&r->who);
    if (err != 0) child_fail(status_fd, err, "become user", r->user);
  }
  if (r->cwd != NULL && chdir(r->cwd) < 0) child_fail(status_fd, errno, "chdir", r->cwd);
  child_exec(status_fd, r->argv, r->envp);
}

/* vfork, not fork: the agent's memory is not copied for a child that execs at once. That is
 * cheap on Linux either way, but under gVisor fork + exec costs 16-28 ms and vfork + exec
 * 6-11 ms. Its own function, so that nothing of the caller's frame is live across vfork. */
static pid_t spawn_child(const struct start_req *r, const int st[2], int in_r, int out_w, int err_w, int slave) {
  pid_t pid = vfork();
  if (pid == 0) {
    close(st[0]);
    child_main(st[1], r, in_r, out_w, err_w, slave);
  }
  return pid;
}

/* ---- the agent side of START ---- */

static void start_failed(uint32_t id, int err, const char *msg) {
  unsigned char e[4];
  put_u32(e, (uint32_t)err);
  send_frame('F', id, e, 4, msg, strlen(msg));
}

/* The poll arrays: an entry per process fd, plus one per relay. They only grow. */
static int reserve_pfds(size_t need) {
  if (need <= pfds_cap) return 0;
  struct pollfd *nf = realloc(pfds, need * sizeof *nf);
  if (nf == NULL) return -1;
  pfds = nf;
  struct proc **no = realloc(pfd_owner, need * sizeof *no);
  if (no == NULL) return -1;
  pfd_owner = no;
  pfds_cap = need;
  return 0;
}

/* Make room for one more process; the poll arrays grow with the table, never per tick. */
static int reserve_slot(void) {
  if (nprocs == procs_cap) {
    size_t cap = procs_cap ? procs_cap * 2 : 16;
    struct proc **np = realloc(procs, cap * sizeof *np);
    if (np == NULL) return -1;
    procs = np;
    if (reserve_pfds(2 + 3 * cap + relay_count()) < 0) return -1;
    procs_cap = cap;
  }
  return 0;
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

/* Parse the START records into a request; strings are copied NUL-terminated into one block. */
static const char *parse_start(const unsigned char *pl, uint32_t len, struct start_req *r, char **block) {
  size_t nargv = 0, nenv = 0;
  for (uint32_t off = 0; off < len;) {
    if (len - off < 5) return "truncated START record";
    uint32_t rl = get_u32(pl + off + 1);
    if (rl > len - off - 5) return "truncated START record";
    unsigned char tag = pl[off];
    if ((tag == 'a' || tag == 'e' || tag == 'c' || tag == 'u') && memchr(pl + off + 5, 0, rl) != NULL)
      return "NUL byte in a START string";
    if (tag == 'a') nargv++;
    if (tag == 'e') nenv++;
    off += 5 + rl;
  }
  if (nargv == 0) return "START without argv";
  r->argv = calloc(nargv + 1, sizeof(char *));
  /* Room for HOME, USER and LOGNAME of a user the request names. */
  r->envp = calloc(nenv + 4, sizeof(char *));
  *block = malloc(len + 1);
  if (r->argv == NULL || r->envp == NULL || *block == NULL) return "out of memory";
  char *s = *block;
  size_t ia = 0, ie = 0;
  for (uint32_t off = 0; off < len;) {
    unsigned char tag = pl[off];
    uint32_t rl = get_u32(pl + off + 1);
    const unsigned char *v = pl + off + 5;
    off += 5 + rl;
    if (tag == 'i') { r->stdin_pipe = rl >= 1 && v[0] == 1; continue; }
    if (tag == 'l') {
      if (rl > MAX_LABEL) return "label record exceeds 16 KiB";
      r->label = v;
      r->label_len = rl;
      continue;
    }
    if (tag == 't') {
      if (rl != 4) return "pty record must be 4 bytes";
      r->is_pty = 1;
      r->cols = (unsigned short)((v[0] << 8) | v[1]);
      r->rows = (unsigned short)((v[2] << 8) | v[3]);
      continue;
    }
    memcpy(s, v, rl);
    s[rl] = '\0';
    if (tag == 'a') r->argv[ia++] = s;
    else if (tag == 'e') r->envp[ie++] = s;
    else if (tag == 'c') r->cwd = s;
    else if (tag == 'u') r->user = rl > 0 ? s : NULL;
    else return "unknown START record tag";
    s += rl + 1;
  }
  return NULL;
}

/* HOME, USER and LOGNAME of the user a request names, unless the request sets them. */
static void add_user_env(struct start_req *r, char **extra) {
  size_t n = 0;
  int has_home = 0, has_user = 0, has_logname = 0;
  for (; r->envp[n] != NULL; n++) {
    has_home |= strncmp(r->envp[n], "HOME=", 5) == 0;
    has_user |= strncmp(r->envp[n], "USER=", 5) == 0;
    has_logname |= strncmp(r->envp[n], "LOGNAME=", 8) == 0;
  }
  size_t size = strlen(r->who.home) + 2 * strlen(r->who.name) + 32;
  char *s = *extra = malloc(size);
  if (s == NULL) return;
  if (!has_home) { r->envp[n++] = s; s += sprintf(s, "HOME=%s", r->who.home) + 1; }
  if (!has_user) { r->envp[n++] = s; s += sprintf(s, "USER=%s", r->who.name) + 1; }
  if (!has_logname) { r->envp[n++] = s; s += sprintf(s, "LOGNAME=%s", r->who.name) + 1; }
  r->envp[n] = NULL;
}

static void handle_start(uint32_t id, const unsigned char *pl, uint32_t len) {
  struct start_req r = {0};
  char *block = NULL, *block_extra = NULL;
  int in_r = -1, in_w = -1, out_r = -1, out_w = -1, err_r = -1, err_w = -1, master = -1, slave = -1;
  int st[2] = {-1, -1};
  struct proc *p = NULL;
  const char *bad = id == 0 ? "process id 0 is reserved" : find_proc(id) ? "process id in use" : NULL;
  if (bad == NULL) bad = parse_start(pl, len, &r, &block);
  if (bad != NULL) { start_failed(id, EINVAL, bad); goto out; }
  if (r.user != NULL) {
    const char *why = NULL;
    int err = agent_user_lookup(r.user, &r.who, &why);
    if (err != 0) {
      char msg[256];
      snprintf(msg, sizeof msg, "user %s: %s", r.user, why);
      start_failed(id, err, msg);
      goto out;
    }
    add_user_env(&r, &block_extra);
  }

  const char *what = "start";
  if (r.is_pty) {
    struct winsize ws = {.ws_row = r.rows, .ws_col = r.cols};
    what = "openpty";
    if (openpty(&master, &slave, NULL, NULL, &ws) < 0) goto sys_fail;
    (void)fcntl(master, F_SETFD, FD_CLOEXEC);
    (void)fcntl(slave, F_SETFD, FD_CLOEXEC);
    what = "dup";
    if ((in_w = fcntl(master, F_DUPFD_CLOEXEC, 3)) < 0) goto sys_fail;
    out_r = master;
    master = -1;
  } else {
    int fds[2];
    what = "pipe";
    if (pipe2(fds, O_CLOEXEC) < 0) goto sys_fail;
    out_r = fds[0]; out_w = fds[1];
    if (pipe2(fds, O_CLOEXEC) < 0) goto sys_fail;
    err_r = fds[0]; err_w = fds[1];
    if (r.stdin_pipe) {
      if (pipe2(fds, O_CLOEXEC) < 0) goto sys_fail;
      in_r = fds[0]; in_w = fds[1];
    }
  }
  what = "pipe";
  if (pipe2(st, O_CLOEXEC) < 0) goto sys_fail;
  p = calloc(1, sizeof *p);
  what = "malloc";
  if (p == NULL) { errno = ENOMEM; goto sys_fail; }
  /* Reserve the table slot before fork so a started child can always be tracked. */
  if (reserve_slot() < 0) { errno = ENOMEM; free(p); p = NULL; goto sys_fail; }

  what = "vfork";
  pid_t pid = spawn_child(&r, st, in_r, out_w, err_w, slave);
  if (pid < 0) { free(p); p = NULL; goto sys_fail; }
  close_fd(&st[1]);
  close_fd(&in_r); close_fd(&out_w); close_fd(&err_w); close_fd(&slave);

  /* The status pipe is CLOEXEC: EOF with no bytes means exec succeeded. vfork returned only
   * once the child exec'd or exited, so this read does not wait. */
  unsigned char status[700];
  size_t got = 0;
  for (;;) {
    ssize_t n = read(st[0], status + got, sizeof status - 1 - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
    if (got == sizeof status - 1) break;
  }
  if (got >= 4) {
    status[got] = '\0';
    int err = (int)get_u32(status);
    const char *failed = (const char *)status + 4;
    size_t fl = strlen(failed);
    const char *arg = 4 + fl + 1 <= got ? failed + fl + 1 : "";
    char msg[700];
    if (*arg) snprintf(msg, sizeof msg, "%s %s: %s", failed, arg, strerror(err));
    else snprintf(msg, sizeof msg, "%s: %s", failed, strerror(err));
    start_failed(id, err, msg);
    free(p); p = NULL; /* the dead child is reaped, and ignored, by the SIGCHLD loop */
    goto out;
  }
  p->id = id; p->pid = pid; p->out_fd = out_r; p->err_fd = err_r; p->in_fd = in_w;
  p->is_pty = r.is_pty;
  if (r.label_len > 0 && (p->label = malloc(r.label_len)) != NULL) {
    memcpy(p->label, r.label, r.label_len);
    p->label_len = r.label_len;
  }
  out_r = err_r = in_w = -1;
  (void)set_nonblock(p->out_fd);
  if (p->err_fd >= 0) (void)set_nonblock(p->err_fd);
  if (p->in_fd >= 0) (void)set_nonblock(p->in_fd);
  procs[nprocs++] = p;
  unsigned char pidbuf[4];
  put_u32(pidbuf, (uint32_t)pid);
  send_frame('T', id, pidbuf, 4, NULL, 0);
  goto out;

sys_fail: {
    char msg[128];
    int err = errno;
    snprintf(msg, sizeof msg, "%s: %s", what, strerror(err));
    start_failed(id, err, msg);
  }
out:
  close_fd(&st[0]); close_fd(&st[1]);
  close_fd(&in_r); close_fd(&in_w); close_fd(&out_r); close_fd(&out_w);
  close_fd(&err_r); close_fd(&err_w); close_fd(&master); close_fd(&slave);
  free(r.argv); free(r.envp); free(block); free(block_extra);
}

/* ---- stdin of children ---- */

static void flush_input(struct proc *p) {
  while (p->in_fd >= 0 && p->pending_off < p->pending_len) {
    ssize_t n = write(p->in_fd, p->pending + p->pending_off, p->pending_len - p->pending_off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return; /* poll for POLLOUT and come back */
    if (n < 0) { close_fd(&p->in_fd); break; } /* EPIPE: the reader is gone, drop the rest */
    p->pending_off += (size_t)n;
  }
  p->pending_off = p->pending_len = 0; /* all written, or nobody left to write to */
  if (p->close_after) { close_fd(&p->in_fd); p->close_after = 0; }
  if (p->pending_cap > OUTPUT_CHUNK) {
    free(p->pending); /* do not keep a burst's buffer for the life of the process */
    p->pending = NULL;
    p->pending_cap = 0;
  }
}

/* Input is queued without bound: stalling the host's command stream behind a child that does
 * not read would also stall SIGNAL, which is how the host gets out of exactly that situation. */
static void queue_input(struct proc *p, const unsigned char *data, size_t len) {
  if (p->in_fd < 0 || p->close_after) return;
  if (p->pending_off > 0) { /* compact once per frame, not once per partial write */
    memmove(p->pending, p->pending + p->pending_off, p->pending_len - p->pending_off);
    p->pending_len -= p->pending_off;
    p->pending_off = 0;
  }
  if (p->pending_len + len > p->pending_cap) {
    size_t cap = p->pending_cap ? p->pending_cap : 4096;
    while (cap < p->pending_len + len) cap *= 2;
    unsigned char *np = realloc(p->pending, cap);
    if (np == NULL) { diag("capsule-agent: out of memory queueing input for %u", p->id); return; }
    p->pending = np;
    p->pending_cap = cap;
  }
  memcpy(p->pending + p->pending_len, data, len);
  p->pending_len += len;
  flush_input(p);
}

/* ---- stdout/stderr of children ---- */

/* Read one chunk and forward it. Returns 0 when the fd reached EOF (and closes it), 1 when data
 * was forwarded, -1 when nothing was ready. A pty master reports EIO once the slave is gone. */
static int pump(struct proc *p, int *fd, char type) {
  ssize_t n;
  do n = read(*fd, outbuf, sizeof outbuf); while (n < 0 && errno == EINTR);
  if (n > 0) { send_frame(type, p->id, outbuf, (size_t)n, NULL, 0); return 1; }
  if (n < 0 && errno == EAGAIN) return -1;
  close_fd(fd);
  return 0;
}

/* After the main child is reaped: forward what is already readable, without waiting for
 * background grandchildren that still hold the pipe (they get EPIPE once it is closed). The
 * bound stops a grandchild that writes forever from holding up the EXIT frame. */
static void drain(struct proc *p, int *fd, char type) {
  for (int i = 0; *fd >= 0 && i < 64; i++)
    if (pump(p, fd, type) != 1) break;
  close_fd(fd);
}

static void finish(size_t idx, int status) {
  struct proc *p = procs[idx];
  drain(p, &p->out_fd, 'O');
  drain(p, &p->err_fd, 'E');
  close_fd(&p->in_fd);
  unsigned char ex[5];
  ex[0] = WIFSIGNALED(status) ? 1 : 0;
  put_u32(ex + 1, (uint32_t)(WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status)));
  send_frame('X', p->id, ex, 5, NULL, 0);
  struct ended *e = &ended_ring[ended_next];
  free(e->label);
  *e = (struct ended){.id = p->id, .pid = p->pid, .flags = (unsigned char)(p->is_pty ? 1 : 0), .kind = ex[0],
                      .value = get_u32(ex + 1), .label = p->label, .label_len = p->label_len};
  ended_next = (ended_next + 1) % ENDED_KEPT;
  if (ended_count < ENDED_KEPT) ended_count++;
  free(p->pending);
  free(p);
  procs[idx] = procs[--nprocs];
}

static void reap(void) {
  struct signalfd_siginfo si;
  while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si) {} /* coalesced: just empty it */
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    /* As subreaper we also inherit orphaned grandchildren: reap them, report only our own. */
    for (size_t i = 0; i < nprocs; i++)
      if (procs[i]->pid == pid) { finish(i, status); break; }
  }
}

/* Host closed our stdin (or broke): kill every tree, report the exits we can, leave. */
static void shutdown_agent(int code) {
  relay_close_all();
  kill_all();
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    reap();
    if (nprocs == 0) break;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long waited = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
    if (waited >= SHUTDOWN_REAP_MS) break;
    struct pollfd sp = {.fd = sigfd, .events = POLLIN};
    (void)poll(&sp, 1, (int)(SHUTDOWN_REAP_MS - waited));
  }
  /* Orphans of the killed trees (reparented to us) may still be dying: collect what is there. */
  while (waitpid(-1, NULL, WNOHANG) > 0) {}
  exit(code);
}

/* ---- LIST: the processes a new host takes over ----
 * Reply 'G' frames with the request's id; payload: u8 more (another 'G' follows), then records
 * of u8 state (0 running, 1 ended), u32 id, u32 pid, u8 flags (1 pty, 2 stdin open), u8 exit
 * kind, u32 exit value (ended only; 0 otherwise), u32 label length, label. Running first, then
 * the ended ones oldest first. */

#define LIST_RECORD_BYTES 19

static unsigned char *list_buf;
static size_t list_len;

static void list_flush(uint32_t id, int more) {
  list_buf[0] = (unsigned char)more;
  send_frame('G', id, list_buf, list_len, NULL, 0);
  list_len = 1;
}

static void list_add(uint32_t id, unsigned char state, uint32_t pid_id, pid_t pid, unsigned char flags, unsigned char kind,
                     uint32_t value, const unsigned char *label, uint32_t label_len) {
  if (list_len + LIST_RECORD_BYTES + label_len > MAX_PAYLOAD) list_flush(id, 1);
  unsigned char *r = list_buf + list_len;
  r[0] = state;
  put_u32(r + 1, pid_id);
  put_u32(r + 5, (uint32_t)pid);
  r[9] = flags;
  r[10] = kind;
  put_u32(r + 11, value);
  put_u32(r + 15, label_len);
  if (label_len > 0) memcpy(r + LIST_RECORD_BYTES, label, label_len);
  list_len += LIST_RECORD_BYTES + label_len;
}

static void handle_list(uint32_t id) {
  list_buf = malloc(MAX_PAYLOAD); /* above the mmap threshold: handed back on free */
  if (list_buf == NULL) { diag("capsule-agent: out of memory for LIST"); return; }
  list_len = 1;
  for (size_t i = 0; i < nprocs; i++) {
    struct proc *p = procs[i];
    unsigned char flags = (unsigned char)((p->is_pty ? 1 : 0) | (p->in_fd >= 0 && !p->close_after ? 2 : 0));
    list_add(id, 0, p->id, p->pid, flags, 0, 0, p->label, p->label_len);
  }
  for (size_t k = 0; k < ended_count; k++) {
    struct ended *e = &ended_ring[(ended_next + ENDED_KEPT - ended_count + k) % ENDED_KEPT];
    list_add(id, 1, e->id, e->pid, e->flags, e->kind, e->value, e->label, e->label_len);
  }
  list_flush(id, 0);
  free(list_buf);
  list_buf = NULL;
}

/* ---- host commands ---- */

static void handle_frame(unsigned char type, uint32_t id, const unsigned char *pl, uint32_t len) {
  if (relay_frame(type, id, pl, len)) return;
  struct proc *p = type == 'S' || type == 'H' || type == 'G' || type == 'Q' ? NULL : find_proc(id);
  switch (type) {
  case 'S': handle_start(id, pl, len); return;
  case 'H': send_frame('H', id, NULL, 0, NULL, 0); return;
  case 'G': handle_list(id); return;
  case 'Q': shutdown_agent(0); return;
  case 'I': if (p != NULL) queue_input(p, pl, len); return;
  case 'C':
    if (p == NULL) return;
    if (p->is_pty) { static const unsigned char eot = 0x04; queue_input(p, &eot, 1); return; }
    p->close_after = 1;
    flush_input(p);
    return;
  case 'K':
    if (p != NULL && len >= 1) signal_tree(p->pid, pl[0]);
    return;
  case 'R':
    if (p != NULL && p->is_pty && len >= 4) {
      struct winsize ws = {.ws_col = (unsigned short)((pl[0] << 8) | pl[1]),
                           .ws_row = (unsigned short)((pl[2] << 8) | pl[3])};
      if (ioctl(p->out_fd >= 0 ? p->out_fd : p->in_fd, TIOCSWINSZ, &ws) < 0)
        diag("capsule-agent: resize %u: %s", id, strerror(errno));
    }
    return;
  default: {
    char msg[64];
    snprintf(msg, sizeof msg, "unknown frame type 0x%02x", type);
    die_protocol(msg);
  }
  }
}

static void read_host(void) {
  ssize_t n;
  do n = read(0, inbuf + inlen, sizeof inbuf - inlen); while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN) return;
  if (n <= 0) shutdown_agent(0);
  inlen += (size_t)n;
  if (inlen > inbuf_high) inbuf_high = inlen;
  size_t off = 0;
  while (inlen - off >= HEADER_BYTES) {
    uint32_t len = get_u32(inbuf + off + 5);
    if (len > MAX_PAYLOAD) {
      char msg[96];
      snprintf(msg, sizeof msg, "frame payload of %u bytes exceeds 1 MiB", len);
      die_protocol(msg);
    }
    if (inlen - off < HEADER_BYTES + len) break;
    handle_frame(inbuf[off], get_u32(inbuf + off + 1), inbuf + off + HEADER_BYTES, len);
    off += HEADER_BYTES + len;
  }
  if (off > 0) memmove(inbuf, inbuf + off, inlen - off);
  inlen -= off;
  /* After a burst of large frames, give the pages back so idle RSS returns to its floor. */
  if (inlen == 0 && inbuf_high > OUTPUT_CHUNK) {
    (void)madvise(inbuf, sizeof inbuf, MADV_DONTNEED);
    inbuf_high = 0;
  }
}

int main(void) {
  /* Children must inherit exactly 0/1/2; make sure none of our own fds lands there. */
  for (int fd = 0; fd <= 2; fd++)
    if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) != fd) return 71;
  signal(SIGPIPE, SIG_IGN);
  /* Fixed thresholds turn off glibc's adaptive ones, which would keep a freed multi-MiB input
   * queue on the heap for good; with these, big buffers are mmapped and unmapped on free. */
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  sigfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd < 0) { diag("capsule-agent: signalfd: %s", strerror(errno)); return 71; }
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) diag("capsule-agent: subreaper: %s", strerror(errno));
  if (reserve_slot() < 0) return 71; /* allocate the tables once, up front */
  static const struct relay_io relay_io = {.send = send_frame, .fail = die_protocol};
  relay_setup(&relay_io);
  send_frame('Y', 0, NULL, 0, NULL, 0);

  for (;;) {
    nfds_t n = 0;
    pfds[n++] = (struct pollfd){.fd = 0, .events = POLLIN};
    pfds[n++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
    for (size_t i = 0; i < nprocs; i++) {
      struct proc *p = procs[i];
      if (p->out_fd >= 0) { pfd_owner[n] = p; pfds[n++] = (struct pollfd){.fd = p->out_fd, .events = POLLIN}; }
      if (p->err_fd >= 0) { pfd_owner[n] = p; pfds[n++] = (struct pollfd){.fd = p->err_fd, .events = POLLIN}; }
      if (p->in_fd >= 0 && p->pending_len > 0) {
        pfd_owner[n] = p;
        pfds[n++] = (struct pollfd){.fd = p->in_fd, .events = POLLOUT};
      }
    }
    nfds_t nproc_fds = n;
    if (reserve_pfds(n + relay_count()) < 0) {
      diag("capsule-agent: out of memory for the poll table");
      shutdown_agent(71);
    }
    n += relay_poll_fds(pfds + n);
    if (poll(pfds, n, -1) < 0) {
      if (errno == EINTR) continue;
      diag("capsule-agent: poll: %s", strerror(errno));
      shutdown_agent(71);
    }
    /* Child fds first (no process is freed here), then reaping, then host commands. */
    for (nfds_t i = 2; i < nproc_fds; i++) {
      struct proc *p = pfd_owner[i];
      if (pfds[i].revents == 0) continue;
      if (pfds[i].fd == p->out_fd) (void)pump(p, &p->out_fd, 'O');
      else if (pfds[i].fd == p->err_fd) (void)pump(p, &p->err_fd, 'E');
      else if (pfds[i].fd == p->in_fd) {
        if (pfds[i].revents & (POLLERR | POLLHUP)) { p->pending_off = p->pending_len = 0; close_fd(&p->in_fd); }
        else flush_input(p);
      }
    }
    relay_poll_done(pfds + nproc_fds, n - nproc_fds);
    if (pfds[1].revents) reap();
    if (pfds[0].revents) read_host();
  }
}

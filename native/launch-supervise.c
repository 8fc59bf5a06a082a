/*
 * capsule-launch --supervise: the per-sandbox supervisor that outlives the Capsule server.
 *
 * The launcher stays the parent of bwrap (or runsc) and owns the agent's stdin and stdout. It
 * listens on a unix socket (0600, in the data directory's 0700 run/ directory); one client at a
 * time, the Capsule server, gets the agent's frames and sends it frames. Between clients (the
 * server crashed, restarts or is being upgraded) the agent's frames go to a spool file, bounded:
 * past the bound, output frames (O, E) are dropped and counted; every other frame (exits, starts,
 * list answers) is kept. A new client first gets a DROPPED frame ('D', id 0, u64 bytes) when
 * output was dropped, then the spool, then live frames.
 *
 * Frames are relayed whole in both directions: a client that goes away in the middle of a frame
 * never leaves half a frame in the agent's input, and a frame to a client that went away lands
 * whole in the spool. One poll loop, no threads, buffers allocated only while frames pass.
 *
 * The sandbox has ended when the agent's output reached end of file and no child is left; the
 * supervisor then removes its socket, pidfile and spool, and writes `<socket>.exit` with the
 * target's status (bwrap's: the agent's exit code, 128+N for a signal), for the server to say why.
 */
#define _GNU_SOURCE
#include "launch-supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define HEADER_BYTES 9
#define MAX_PAYLOAD (1024u * 1024u)
#define TO_AGENT_HIGH (4u * 1024u * 1024u) /* stop reading the client past this much queued */

struct buf {
  unsigned char *data;
  size_t len, cap;
};

static int buf_reserve(struct buf *b, size_t more) {
  if (b->len + more <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + more) cap *= 2;
  unsigned char *data = realloc(b->data, cap);
  if (data == NULL) return -1;
  b->data = data;
  b->cap = cap;
  return 0;
}

/* Drops the first n bytes; an emptied buffer is freed, so an idle supervisor holds no heap. */
static void buf_consume(struct buf *b, size_t n) {
  if (n < b->len) memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
  if (b->len == 0) {
    free(b->data);
    *b = (struct buf){0};
  }
}

static uint32_t get_u32(const unsigned char *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Length of the complete frame at the start of b, 0 when incomplete, -1 when oversized. */
static long frame_at(const struct buf *b, size_t off) {
  if (b->len - off < HEADER_BYTES) return 0;
  uint32_t len = get_u32(b->data + off + 5);
  if (len > MAX_PAYLOAD) return -1;
  return b->len - off < HEADER_BYTES + (size_t)len ? 0 : (long)(HEADER_BYTES + len);
}

static int write_all(int fd, const unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        (void)poll(&pf, 1, 1000);
        continue;
      }
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

int supervise_listen(const char *path) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path) {
    fprintf(stderr, "capsule-launch: socket path longer than %zu bytes: %s\n", sizeof addr.sun_path - 1, path);
    exit(125);
  }
  strcpy(addr.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  (void)unlink(path);
  mode_t old = umask(0177);
  int bound = bind(fd, (struct sockaddr *)&addr, sizeof addr);
  umask(old);
  if (bound != 0 || listen(fd, 4) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static const struct supervise_options *opts;
static int client = -1, spool_fd = -1;
static unsigned long long spooled, dropped;
static struct buf from_agent, from_client, to_agent;

static void spool_frame(const unsigned char *frame, size_t n) {
  unsigned char type = frame[0];
  if ((type == 'O' || type == 'E') && spooled + n > opts->spool_bytes) {
    dropped += n - HEADER_BYTES;
    return;
  }
  if (spool_fd < 0) spool_fd = open(opts->spool_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0600);
  if (spool_fd < 0 || write_all(spool_fd, frame, n) != 0) {
    /* A full disk: the frame is lost like a dropped one; the agent keeps running. */
    dropped += n - HEADER_BYTES;
    return;
  }
  spooled += n;
}

static void drop_client(void) {
  if (client >= 0) close(client);
  client = -1;
  buf_consume(&from_client, from_client.len); /* half a frame never reaches the agent */
}

static void deliver(const unsigned char *frame, size_t n) {
  if (client >= 0 && write_all(client, frame, n) == 0) return;
  if (client >= 0) drop_client();
  spool_frame(frame, n);
}

/* A new client: what it missed first, then it takes over. */
static void attach_client(int fd) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid()) {
    close(fd);
    return;
  }
  int flags = fcntl(fd, F_GETFL);
  (void)fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  client = fd;
  if (dropped > 0) {
    unsigned char d[HEADER_BYTES + 8] = {'D', 0, 0, 0, 0, 0, 0, 0, 8};
    for (int i = 0; i < 8; i++) d[HEADER_BYTES + i] = (unsigned char)(dropped >> (56 - 8 * i));
    if (write_all(client, d, sizeof d) != 0) { drop_client(); return; }
    dropped = 0;
  }
  if (spool_fd >= 0) {
    unsigned char chunk[65536];
    off_t at = 0;
    for (;;) {
      ssize_t n = pread(spool_fd, chunk, sizeof chunk, at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      if (write_all(client, chunk, (size_t)n) != 0) { drop_client(); return; } /* the spool stays for the next */
      at += n;
    }
    close(spool_fd);
    spool_fd = -1;
    (void)unlink(opts->spool_path);
    spooled = 0;
  }
}

static void read_agent(int agent_out, int *open_out) {
  if (buf_reserve(&from_agent, 65536) != 0) return;
  ssize_t n = read(agent_out, from_agent.data + from_agent.len, from_agent.cap - from_agent.len);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    *open_out = 0;
    return;
  }
  from_agent.len += (size_t)n;
  size_t off = 0;
  long f;
  while ((f = frame_at(&from_agent, off)) > 0) {
    deliver(from_agent.data + off, (size_t)f);
    off += (size_t)f;
  }
  if (f < 0) {
    fprintf(stderr, "capsule-launch: the agent sent an oversized frame; ending the sandbox\n");
    *open_out = 0;
    return;
  }
  buf_consume(&from_agent, off);
}

static void read_client(void) {
  if (buf_reserve(&from_client, 65536) != 0) return;
  ssize_t n = read(client, from_client.data + from_client.len, from_client.cap - from_client.len);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) { drop_client(); return; }
  from_client.len += (size_t)n;
  size_t off = 0;
  long f;
  while ((f = frame_at(&from_client, off)) > 0) {
    if (buf_reserve(&to_agent, (size_t)f) != 0) break;
    memcpy(to_agent.data + to_agent.len, from_client.data + off, (size_t)f);
    to_agent.len += (size_t)f;
    off += (size_t)f;
  }
  if (f < 0) { drop_client(); return; } /* a broken client, not a broken sandbox */
  buf_consume(&from_client, off);
}

static void flush_agent(int agent_in, int *open_in) {
  ssize_t n = write(agent_in, to_agent.data, to_agent.len);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n < 0) { *open_in = 0; buf_consume(&to_agent, to_agent.len); return; }
  buf_consume(&to_agent, (size_t)n);
}

static void finish(int status) {
  (void)unlink(opts->socket_path);
  if (opts->pid_path) (void)unlink(opts->pid_path);
  if (spool_fd >= 0) close(spool_fd);
  (void)unlink(opts->spool_path);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 125;
  {
    /* The reason for the server: this one (the agent's end looks like ours), or the next. */
    char path[4200], text[32];
    if (snprintf(path, sizeof path, "%s.exit", opts->socket_path) < (int)sizeof path) {
      int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      int len = snprintf(text, sizeof text, "%d\n", code);
      if (fd >= 0) {
        (void)write_all(fd, (unsigned char *)text, (size_t)len);
        close(fd);
      }
    }
  }
  exit(code);
}

void supervise(const struct supervise_options *options, int listen_fd, int agent_in, int agent_out, int sigfd, pid_t child) {
  opts = options;
  int open_out = 1, open_in = 1, have_children = 1, child_status = 0;
  (void)fcntl(agent_in, F_SETFL, fcntl(agent_in, F_GETFL) | O_NONBLOCK);
  for (;;) {
    struct pollfd pf[4];
    nfds_t n = 0;
    pf[n++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
    pf[n++] = (struct pollfd){.fd = open_out ? agent_out : -1, .events = POLLIN};
    pf[n++] = (struct pollfd){.fd = open_in && to_agent.len > 0 ? agent_in : -1, .events = POLLOUT};
    /* One client at a time: the listening socket is watched only while nobody is attached. */
    int from = client >= 0 ? client : listen_fd;
    pf[n++] = (struct pollfd){.fd = client >= 0 && to_agent.len >= TO_AGENT_HIGH ? -1 : from, .events = POLLIN};
    if (poll(pf, n, -1) < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "capsule-launch: poll: %s\n", strerror(errno));
      exit(125);
    }
    if (pf[0].revents) {
      struct signalfd_siginfo si;
      while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
      }
      for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid == child) child_status = status;
        if (pid < 0) have_children = 0;
        if (pid <= 0) break;
      }
    }
    if (pf[1].revents) read_agent(agent_out, &open_out);
    if (pf[2].revents & (POLLERR | POLLHUP)) { open_in = 0; buf_consume(&to_agent, to_agent.len); }
    else if (pf[2].revents) flush_agent(agent_in, &open_in);
    if (pf[3].revents) {
      if (client >= 0) read_client();
      else {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) attach_client(fd);
      }
    }
    if (!open_in && to_agent.len > 0) buf_consume(&to_agent, to_agent.len);
    if (!open_out && !have_children) finish(child_status);
    if (!open_out && have_children) {
      /* The agent is gone; what is left of the sandbox ends with bwrap. Wait for it. */
      int status;
      pid_t pid;
      while ((pid = waitpid(-1, &status, 0)) > 0 || (pid < 0 && errno == EINTR))
        if (pid == child) child_status = status;
      finish(child_status);
    }
  }
}

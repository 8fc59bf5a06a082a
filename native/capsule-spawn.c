/*
 * capsule-spawn: starts the Capsule server's long-lived children (each sandbox's supervisor), so
 * that the server never forks itself. A fork copies the forking process's page tables and then
 * makes it take a fault on each page it writes; Node's spawn also waits in the fork until the
 * child has exec'd. For a server with hundreds of MiB mapped that was ~4.5 ms of its event loop
 * per sandbox under load (a quarter of its time at 1,000 live). This process is small and static.
 *
 * The server starts one and talks to it over its stdin and stdout. It dies with the server
 * (PR_SET_PDEATHSIG) or when its stdin closes; what it started lives on (each in its own session).
 *
 * Request (stdin): u32 little-endian length N, then N bytes: ID, LOG, PROGRAM, ARGS..., each
 * NUL-terminated. The child gets /dev/null on stdin, a pipe on stdout, LOG (created 0600,
 * truncated) on stderr, no other fd, an empty environment and a session of its own.
 * Replies (stdout), one line each:
 *   S ID PID      started
 *   R ID          its stdout began with "ready\n" (then this end of the pipe is closed)
 *   N ID          its stdout ended without that
 *   F ID ERRNO    it could not be started (pipe or fork failed)
 *   X PID STATUS  it ended: its exit code, 128+N for signal N
 * An exec failure is written to LOG and ends the child with 127 (then N and X 127).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_REQUEST (256u * 1024u)
#define MAX_ARGS 4096
#define MAX_ID 64
#define READY "ready\n"
#define READY_LEN 6

struct pending {
    int fd;
    char id[MAX_ID];
    char said[READY_LEN];
    size_t len;
};

static struct pending *pending;
static size_t npending, cappending;

static void reply(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void reply(const char *fmt, ...) {
    char line[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n <= 0 || (size_t)n >= sizeof line) return;
    /* Lines are shorter than PIPE_BUF: each write is whole. A server that went away ends us. */
    for (int off = 0; off < n;) {
        ssize_t w = write(STDOUT_FILENO, line + off, (size_t)(n - off));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) exit(0);
        off += (int)w;
    }
}

/* In the child: never returns. */
static void start_child(const char *log, char **argv, int out) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    if (setsid() < 0) _exit(127);
    int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int err = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_NOCTTY | O_CLOEXEC, 0600);
    if (in < 0 || err < 0) {
        dprintf(STDERR_FILENO, "capsule-spawn: open %s: %s\n", in < 0 ? "/dev/null" : log, strerror(errno));
        _exit(127);
    }
    if (dup2(in, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0 || dup2(err, STDERR_FILENO) < 0) _exit(127);
    if (close_range(3, ~0U, 0) != 0) _exit(127);
    char *envp[] = {NULL};
    execve(argv[0], argv, envp);
    dprintf(STDERR_FILENO, "capsule-spawn: exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

static void spawn_one(char *payload, size_t len) {
    char *fields[MAX_ARGS + 3];
    size_t count = 0;
    for (size_t at = 0; at < len && count < MAX_ARGS + 2;) {
        char *end = memchr(payload + at, '\0', len - at);
        if (end == NULL) break;
        fields[count++] = payload + at;
        at = (size_t)(end - payload) + 1;
    }
    /* ID, LOG, PROGRAM at least; an ID we could not echo back is a broken server: stop. */
    if (count < 3 || strlen(fields[0]) >= MAX_ID || strchr(fields[0], ' ') != NULL || strchr(fields[0], '\n') != NULL) {
        dprintf(STDERR_FILENO, "capsule-spawn: malformed request\n");
        exit(2);
    }
    const char *id = fields[0], *log = fields[1];
    char **argv = &fields[2];
    fields[count] = NULL;
    if (npending == cappending) {
        size_t cap = cappending ? cappending * 2 : 16;
        struct pending *grown = realloc(pending, cap * sizeof *pending);
        if (grown == NULL) {
            reply("F %s %d\n", id, ENOMEM);
            return;
        }
        pending = grown;
        cappending = cap;
    }
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        reply("F %s %d\n", id, errno);
        return;
    }
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(pipefd[0]);
        close(pipefd[1]);
        reply("F %s %d\n", id, e);
        return;
    }
    if (pid == 0) start_child(log, argv, pipefd[1]);
    close(pipefd[1]);
    fcntl(pipefd[0], F_SETFL, O_NONBLOCK);
    struct pending *p = &pending[npending++];
    p->fd = pipefd[0];
    p->len = 0;
    strcpy(p->id, id);
    reply("S %s %d\n", id, (int)pid);
}

/* Reads what a pending child says; true once it is settled (ready, or its stdout ended). */
static int hear(struct pending *p) {
    char chunk[256];
    for (;;) {
        ssize_t n = read(p->fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return 0; /* EAGAIN: more later */
        if (n == 0) {
            reply("N %s\n", p->id);
            return 1;
        }
        size_t take = (size_t)n < READY_LEN - p->len ? (size_t)n : READY_LEN - p->len;
        memcpy(p->said + p->len, chunk, take);
        p->len += take;
        if (p->len == READY_LEN && memcmp(p->said, READY, READY_LEN) == 0) {
            reply("R %s\n", p->id);
            return 1;
        }
        /* Anything else first: keep draining until it ends (then N). */
    }
}

static void reap(int sfd) {
    struct signalfd_siginfo info;
    while (read(sfd, &info, sizeof info) == (ssize_t)sizeof info) {
    }
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        reply("X %d %d\n", (int)pid, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
}

int main(void) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) return 1;
    if (getppid() == 1) return 0; /* the server is gone already */
    signal(SIGPIPE, SIG_IGN);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) return 1;
    unsigned char *request = NULL;
    size_t have = 0, cap = 0;
    struct pollfd *fds = NULL;
    size_t capfds = 0;
    for (;;) {
        if (capfds < npending + 2) {
            capfds = (npending + 2) * 2;
            struct pollfd *grown = realloc(fds, capfds * sizeof *fds);
            if (grown == NULL) return 1;
            fds = grown;
        }
        fds[0] = (struct pollfd){.fd = STDIN_FILENO, .events = POLLIN};
        fds[1] = (struct pollfd){.fd = sfd, .events = POLLIN};
        for (size_t i = 0; i < npending; i++) fds[i + 2] = (struct pollfd){.fd = pending[i].fd, .events = POLLIN};
        size_t polled = npending;
        if (poll(fds, polled + 2, -1) < 0) {
            if (errno == EINTR) continue;
            return 1;
        }
        if (fds[1].revents) reap(sfd);
        /* Settled children leave the table back to front, so indexes below stay valid. */
        for (size_t i = polled; i-- > 0;) {
            if (!fds[i + 2].revents || !hear(&pending[i])) continue;
            close(pending[i].fd);
            pending[i] = pending[--npending];
        }
        if (fds[0].revents) {
            if (have == cap) {
                cap = cap ? cap * 2 : 4096;
                if (cap > MAX_REQUEST + 4) cap = MAX_REQUEST + 4;
                unsigned char *grown = realloc(request, cap);
                if (grown == NULL) return 1;
                request = grown;
            }
            ssize_t n = read(STDIN_FILENO, request + have, cap - have);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) return 0; /* the server closed us */
            have += (size_t)n;
            for (;;) {
                if (have < 4) break;
                uint32_t len = (uint32_t)request[0] | (uint32_t)request[1] << 8 | (uint32_t)request[2] << 16 | (uint32_t)request[3] << 24;
                if (len > MAX_REQUEST) {
                    dprintf(STDERR_FILENO, "capsule-spawn: request of %u bytes\n", len);
                    return 2;
                }
                if (have < 4 + (size_t)len) break;
                spawn_one((char *)request + 4, len);
                memmove(request, request + 4 + len, have - 4 - len);
                have -= 4 + (size_t)len;
            }
        }
    }
}

/*
 * TCP relays of capsule-agent: see agent-relay.h for the frames and the flow control. Everything
 * here runs on the agent's one thread, from its poll loop; nothing blocks.
 */
#define _GNU_SOURCE
#include "agent-relay.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define RELAY_CHUNK (64u * 1024u)

struct relay {
    uint32_t id;
    int fd;
    uint16_t port;
    int connecting;        /* 0: connected; AF_INET or AF_INET6: that connect is in progress */
    int read_eof;          /* the socket's input ended and the host was told ('z' 1) */
    int host_eof;          /* the host ended its input: shut down writing once pending is out */
    int dead;              /* closed; removed by sweep() */
    uint32_t credit;       /* bytes the host still accepts ('d'), renewed by its 'W' */
    uint32_t written;      /* bytes written to the socket and not yet acknowledged ('w') */
    unsigned char *pending; /* the host's bytes the socket has not taken: pending[off, off+len) */
    size_t off, len;
};

static const struct relay_io *io;
static struct relay *relays[RELAY_MAX];
static size_t nrelays;
/* The relay of each entry relay_poll_fds wrote, so that relay_poll_done can match them. */
static struct relay *polled[RELAY_MAX];
static unsigned char readbuf[RELAY_CHUNK];

void relay_setup(const struct relay_io *io_) { io = io_; }

size_t relay_count(void) { return nrelays; }

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static struct relay *find(uint32_t id) {
    for (size_t i = 0; i < nrelays; i++)
        if (relays[i]->id == id && !relays[i]->dead) return relays[i];
    return NULL;
}

/* Marks a relay closed; its memory goes in sweep(), once nothing iterates over it. */
static void drop(struct relay *r) {
    if (r->dead) return;
    r->dead = 1;
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
    free(r->pending);
    r->pending = NULL;
}

static void sweep(void) {
    for (size_t i = 0; i < nrelays;) {
        if (relays[i]->dead) {
            free(relays[i]);
            relays[i] = relays[--nrelays];
        } else {
            i++;
        }
    }
}

static void send_connected(struct relay *r, int err) {
    unsigned char e[4];
    char msg[128];
    put_u32(e, (uint32_t)err);
    int n = err == 0 ? 0 : snprintf(msg, sizeof msg, "connect to 127.0.0.1:%u: %s", r->port, strerror(err));
    io->send('p', r->id, e, 4, msg, n > 0 ? (size_t)n : 0);
}

/* The relay ended by an error: the host is told, the socket closed. */
static void fail_relay(struct relay *r, int err) {
    unsigned char z[5];
    z[0] = 0;
    put_u32(z + 1, (uint32_t)err);
    io->send('z', r->id, z, 5, NULL, 0);
    drop(r);
}

static void maybe_finish(struct relay *r) {
    if (r->read_eof && r->host_eof && r->len == 0) drop(r);
}

/* Starts a non-blocking connect to the loopback of `family`; returns 0 (done or in progress) or an errno. */
static int start_connect(struct relay *r, int family) {
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno;
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc;
    if (family == AF_INET) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(r->port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(r->port), .sin6_addr = IN6ADDR_LOOPBACK_INIT};
        rc = connect(fd, (struct sockaddr *)&a, sizeof a);
    }
    if (rc == 0 || errno == EINPROGRESS) {
        r->fd = fd;
        r->connecting = rc == 0 ? 0 : family;
        return 0;
    }
    int err = errno;
    close(fd);
    return err;
}

/* A server bound to ::1 only (what `localhost` means to some runtimes) is tried after 127.0.0.1. */
static int connect_next(struct relay *r, int family, int err) {
    if (family == AF_INET && (err == ECONNREFUSED || err == EADDRNOTAVAIL || err == ENETUNREACH)) {
        int err6 = start_connect(r, AF_INET6);
        if (err6 == 0) return 0;
    }
    return err;
}

static void connected(struct relay *r) {
    r->connecting = 0;
    r->credit = RELAY_WINDOW;
    send_connected(r, 0);
}

static void handle_open(uint32_t id, const unsigned char *pl, uint32_t len) {
    struct relay probe = {.id = id, .fd = -1};
    if (id == 0 || len != 2 || ((pl[0] << 8) | pl[1]) == 0) { send_connected(&probe, EINVAL); return; }
    probe.port = (uint16_t)((pl[0] << 8) | pl[1]);
    if (find(id) != NULL) { send_connected(&probe, EEXIST); return; }
    if (nrelays == RELAY_MAX) { send_connected(&probe, EMFILE); return; }
    struct relay *r = calloc(1, sizeof *r);
    if (r == NULL) { send_connected(&probe, ENOMEM); return; }
    *r = probe;
    int err = start_connect(r, AF_INET);
    if (err != 0) err = connect_next(r, AF_INET, err);
    if (err != 0) {
        send_connected(r, err);
        free(r);
        return;
    }
    relays[nrelays++] = r;
    if (r->connecting == 0) connected(r);
}

/* The socket became writable (or failed) while connecting. */
static void finish_connect(struct relay *r) {
    int err = 0;
    socklen_t sl = sizeof err;
    if (getsockopt(r->fd, SOL_SOCKET, SO_ERROR, &err, &sl) < 0) err = errno;
    if (err == EINPROGRESS || err == EALREADY) return;
    if (err == 0) { connected(r); return; }
    if (err == ECONNRESET || err == EPIPE) {
        /* The server accepted, then reset before this poll turn: the connection existed, so the
         * host learns it opened and ended by the reset (a refused connect is ECONNREFUSED). */
        connected(r);
        fail_relay(r, err);
        return;
    }
    int family = r->connecting;
    close(r->fd);
    r->fd = -1;
    err = connect_next(r, family, err);
    if (err != 0) {
        send_connected(r, err);
        r->dead = 1;
        return;
    }
    if (r->connecting == 0) connected(r);
}

static void acknowledge(struct relay *r, int force) {
    if (r->written == 0 || (!force && r->written < RELAY_WINDOW / 2)) return;
    unsigned char n[4];
    put_u32(n, r->written);
    io->send('w', r->id, n, 4, NULL, 0);
    r->written = 0;
}

/* Writes what the socket takes of pending; 0, or -1 when the relay failed (and was dropped). */
static int flush(struct relay *r) {
    while (r->len > 0) {
        ssize_t n = send(r->fd, r->pending + r->off, r->len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) break;
        if (n < 0) { fail_relay(r, errno); return -1; }
        r->off += (size_t)n;
        r->len -= (size_t)n;
        r->written += (uint32_t)n;
    }
    if (r->len == 0) {
        r->off = 0;
        free(r->pending); /* an idle relay keeps no buffer */
        r->pending = NULL;
        if (r->host_eof) (void)shutdown(r->fd, SHUT_WR);
    }
    acknowledge(r, 0);
    maybe_finish(r);
    return 0;
}

static void handle_data(uint32_t id, const unsigned char *pl, uint32_t len) {
    struct relay *r = find(id);
    if (r == NULL) return; /* ended on this side; the host learns it from 'z' */
    if (r->connecting) { io->fail("relay data before the relay was connected"); return; }
    if (r->host_eof) { io->fail("relay data after the host's end of input"); return; }
    if (r->len + len > RELAY_WINDOW) { io->fail("the host sent more than the relay window"); return; }
    if (r->pending == NULL) {
        r->pending = malloc(RELAY_WINDOW);
        if (r->pending == NULL) { fail_relay(r, ENOMEM); return; }
    }
    if (r->off + r->len + len > RELAY_WINDOW) {
        memmove(r->pending, r->pending + r->off, r->len);
        r->off = 0;
    }
    memcpy(r->pending + r->off + r->len, pl, len);
    r->len += len;
    (void)flush(r);
}

static void handle_window(uint32_t id, const unsigned char *pl, uint32_t len) {
    struct relay *r = find(id);
    if (r == NULL) return;
    if (len != 4) { io->fail("relay window frame must be 4 bytes"); return; }
    uint32_t n = get_u32(pl);
    if (n > RELAY_WINDOW - r->credit) { io->fail("the host acknowledged more than the relay sent"); return; }
    r->credit += n;
}

static void handle_close(uint32_t id, const unsigned char *pl, uint32_t len) {
    if (id == 0) { relay_close_all(); return; }
    struct relay *r = find(id);
    if (r == NULL) return;
    if (len >= 1 && pl[0] == 1 && !r->connecting) {
        r->host_eof = 1;
        (void)flush(r);
    } else {
        drop(r);
    }
    sweep();
}

int relay_frame(unsigned char type, uint32_t id, const unsigned char *pl, uint32_t len) {
    switch (type) {
    case 'P': handle_open(id, pl, len); return 1;
    case 'D': handle_data(id, pl, len); sweep(); return 1;
    case 'W': handle_window(id, pl, len); return 1;
    case 'Z': handle_close(id, pl, len); return 1;
    default: return 0;
    }
}

size_t relay_poll_fds(struct pollfd *out) {
    size_t n = 0;
    for (size_t i = 0; i < nrelays; i++) {
        struct relay *r = relays[i];
        short events = 0;
        if (r->connecting) events = POLLOUT;
        else {
            if (r->credit > 0 && !r->read_eof) events |= POLLIN;
            if (r->len > 0) events |= POLLOUT;
        }
        /* No entry without events: a hung-up socket would report POLLHUP on every turn. */
        if (events == 0 || r->dead) continue;
        polled[n] = r;
        out[n++] = (struct pollfd){.fd = r->fd, .events = events};
    }
    return n;
}

static void pump(struct relay *r) {
    uint32_t want = r->credit < RELAY_CHUNK ? r->credit : RELAY_CHUNK;
    ssize_t n;
    do n = recv(r->fd, readbuf, want, 0); while (n < 0 && errno == EINTR);
    if (n > 0) {
        r->credit -= (uint32_t)n;
        io->send('d', r->id, readbuf, (size_t)n, NULL, 0);
        return;
    }
    if (n < 0 && errno == EAGAIN) return;
    if (n < 0) { fail_relay(r, errno); return; }
    unsigned char z = 1;
    r->read_eof = 1;
    io->send('z', r->id, &z, 1, NULL, 0);
    maybe_finish(r);
}

void relay_poll_done(const struct pollfd *fds, size_t n) {
    for (size_t i = 0; i < n; i++) {
        struct relay *r = polled[i];
        short ev = fds[i].revents;
        if (ev == 0 || r->dead) continue;
        if (r->connecting) { finish_connect(r); continue; }
        if ((fds[i].events & POLLOUT) && (ev & (POLLOUT | POLLERR | POLLHUP)) && flush(r) < 0) continue;
        if (!r->dead && (fds[i].events & POLLIN) && (ev & (POLLIN | POLLERR | POLLHUP))) pump(r);
    }
    sweep();
}

void relay_close_all(void) {
    for (size_t i = 0; i < nrelays; i++) drop(relays[i]);
    sweep();
}

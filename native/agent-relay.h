/*
 * TCP relays of the agent: the host asks the agent to connect to a port on the sandbox's own
 * loopback, then bytes flow both ways in frames, multiplexed by a relay id. This is how the
 * server reaches a port inside a sandbox that has no network (an empty network namespace) or its
 * own netstack (gVisor): only through the agent, never by a route from the host.
 *
 * host -> agent                              agent -> host
 *   'P' id, u16 port: connect                  'p' id, i32 errno (0: connected), message
 *   'D' id, bytes: write to the socket         'd' id, bytes read from the socket
 *   'W' id, u32 n: host consumed n bytes       'w' id, u32 n: n bytes were written to the socket
 *   'Z' id, u8 how: 1 end of input (half        'z' id, u8 how (1: the socket's end of input;
 *       close), 0 abort; id 0 aborts every         0: closed by an error, then i32 errno)
 *       relay (a new client took over)
 *
 * Flow control: each side may have at most RELAY_WINDOW bytes in flight that the other has not
 * acknowledged ('W'/'w'); the agent reads its socket only while it has credit and buffers at most
 * one window of the host's bytes per relay, so a slow reader on either side stalls only its relay.
 */
#ifndef CAPSULE_AGENT_RELAY_H
#define CAPSULE_AGENT_RELAY_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#define RELAY_WINDOW (128u * 1024u)
#define RELAY_MAX 256

/* How the relay module talks back: the agent's one frame writer, and its protocol-error exit. */
struct relay_io {
    void (*send)(char type, uint32_t id, const void *a, size_t alen, const void *b, size_t blen);
    void (*fail)(const char *message);
};

void relay_setup(const struct relay_io *io);

/* Handles a host frame of the relay protocol ('P', 'D', 'W', 'Z'); returns 0 for any other type. */
int relay_frame(unsigned char type, uint32_t id, const unsigned char *payload, uint32_t len);

/* Open relays: an upper bound of the poll entries relay_poll_fds adds. */
size_t relay_count(void);

/* Writes the poll entries of the relays to `out`; returns how many. */
size_t relay_poll_fds(struct pollfd *out);

/* Acts on what poll() reported for the entries relay_poll_fds wrote (same order, `n` of them). */
void relay_poll_done(const struct pollfd *fds, size_t n);

/* Closes every relay without reporting (the agent is leaving). */
void relay_close_all(void);

#endif

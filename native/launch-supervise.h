/*
 * capsule-launch --supervise: the per-sandbox supervisor. See launch-supervise.c.
 */
#ifndef CAPSULE_LAUNCH_SUPERVISE_H
#define CAPSULE_LAUNCH_SUPERVISE_H

#include <sys/types.h>

struct supervise_options {
  const char *socket_path;
  const char *spool_path;
  const char *pid_path; /* removed on exit; NULL when none */
  unsigned long long spool_bytes;
};

/* Binds and listens on the unix socket at `path`, mode 0600 (a stale file is replaced). */
int supervise_listen(const char *path);

/*
 * Relays frames between one client on `listen_fd` and the agent (its stdin `agent_in`, its stdout
 * `agent_out`), spooling the agent's frames to disk while no client is attached; reaps `child`
 * and every orphan. Exits the process when the sandbox has ended; never returns.
 */
void supervise(const struct supervise_options *options, int listen_fd, int agent_in, int agent_out, int sigfd, pid_t child);

#endif

/*
 * Users of a sandbox from a template: the agent runs as root inside its user namespace and starts
 * each process as the user it names, looked up in the sandbox's own /etc/passwd and /etc/group
 * (parsed here: the agent is static and has no NSS).
 */
#ifndef CAPSULE_AGENT_USERS_H
#define CAPSULE_AGENT_USERS_H

#include <sys/types.h>

#define AGENT_MAX_GROUPS 64

struct agent_user {
    uid_t uid;
    gid_t gid;
    gid_t groups[AGENT_MAX_GROUPS];
    int ngroups;
    char name[64];
    char home[256];
};

/*
 * Resolves "name", "uid" or "uid:gid" (a numeric uid need not be in /etc/passwd; its home is then
 * "/"). Returns 0, or an errno (ENOENT: no such user) with `why` set to a message.
 */
int agent_user_lookup(const char *spec, struct agent_user *out, const char **why);

/*
 * Becomes `u` in a vfork child: raw system calls only (glibc's setuid family signals every
 * thread, which a vfork child must not). Returns 0 or an errno.
 */
int agent_user_become(const struct agent_user *u);

#endif

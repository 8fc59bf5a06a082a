/*
 * Host mounts for capsule-launch: a tenant names an operator's mount root and a subpath under
 * it; this resolves the subpath as root without trusting anything in it, and hands the result on
 * as an fd (bwrap --ro-bind-fd) or as a detached mount in a private mount namespace (gVisor).
 */
#ifndef CAPSULE_LAUNCH_MOUNTS_H
#define CAPSULE_LAUNCH_MOUNTS_H

struct launch_mount {
    int index;         /* the spec's mounts[index], for error messages */
    int fd;            /* where the resolved O_PATH fd ends up */
    char kind;         /* 'd' directory or 'f' regular file: what the caller prepared for */
    const char *root;  /* the operator's mount root, a canonical absolute path */
    const char *sub;   /* relative path under it; "." for the root itself */
};

/* A mount to show in the launcher child's private mount namespace. */
struct launch_attach {
    int fd;            /* an open fd of what to mount (closed once cloned) */
    int readonly;
    int idmap;         /* seen through the sandbox's user namespace (--userns): its 0..N are the disk's 0..N */
    const char *target; /* absolute, or relative to the stage directory (made there) */
};

/* Nothing at, under or above `dir` (Capsule's data directory) may be mounted. Call once. */
void mounts_forbid(const char *dir);

/*
 * Resolves every mount to an fd at its number, or exits 125 with
 * "capsule-launch: mount I refused (CODE): why" on stderr (CODE is a Capsule error code).
 */
void mounts_resolve(struct launch_mount *mounts, int count);

/*
 * Enters a new private mount namespace and mounts a detached clone of each fd at its target
 * (nosuid, nodev; read-only when asked). With `stage`, a small tmpfs is mounted there first and
 * relative targets are made in it: bubblewrap, which runs unprivileged and binds by path, then
 * finds Capsule's private directories under a path that exists only in this namespace.
 */
void attach_all(const char *stage, struct launch_attach *list, int count, int userns_fd);

/*
 * A user namespace owned by host uid `base` in which ids 0..count-1 are host ids
 * base..base+count-1 (written by us, as root, so dpkg inside can chown to any of them). Returns
 * an fd of it (CLOEXEC). Its owner is `base` so that bubblewrap, running as `base`, can join it.
 */
int make_userns(unsigned long base, unsigned long count);

#endif

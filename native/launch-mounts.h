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
    const char *attach; /* gVisor: attach the result here in a private mount namespace, or NULL */
};

/* Nothing at, under or above `dir` (Capsule's data directory) may be mounted. Call once. */
void mounts_forbid(const char *dir);

/*
 * Resolves every mount to an fd at its number, or exits 125 with
 * "capsule-launch: mount I refused (CODE): why" on stderr (CODE is a Capsule error code).
 */
void mounts_resolve(struct launch_mount *mounts, int count);

/* Moves the resolved mounts that have an `attach` target into a new private mount namespace. */
void mounts_attach(struct launch_mount *mounts, int count);

#endif

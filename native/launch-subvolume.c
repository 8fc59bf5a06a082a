#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/btrfs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launch-subvolume.h"

static void fail(const char *path, const char *what) {
    fprintf(stderr, "capsule-launch: subvolume %s: %s: %s\n", path, what, strerror(errno));
    exit(125);
}

static unsigned long long parse_number(const char *text, const char *what, const char *usage) {
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-') {
        fprintf(stderr, "capsule-launch: %s (bad %s)\n", usage, what);
        exit(125);
    }
    return value;
}

static uid_t tree_owner;

static int own_entry(const char *path, const struct stat *info, int kind, struct FTW *where) {
    (void)info;
    (void)kind;
    (void)where;
    return lchown(path, tree_owner, tree_owner) == 0 ? 0 : -1;
}

void subvolume_create(char *spec, const char *source, const char *spare) {
    char *first = strchr(spec, ':');
    char *second = first == NULL ? NULL : strchr(first + 1, ':');
    if (second == NULL) {
        fprintf(stderr, "capsule-launch: --subvolume wants UID:LIMIT_BYTES:PATH\n");
        exit(125);
    }
    *first = '\0';
    *second = '\0';
    unsigned long long owner = parse_number(spec, "uid", "--subvolume wants UID:LIMIT_BYTES:PATH");
    unsigned long long limit = parse_number(first + 1, "limit", "--subvolume wants UID:LIMIT_BYTES:PATH");
    char *path = second + 1;
    char *slash = strrchr(path, '/');
    if (path[0] != '/' || slash == NULL || slash[1] == '\0' || strlen(slash + 1) >= BTRFS_PATH_NAME_MAX || owner > 0xfffffffeULL) {
        errno = EINVAL;
        fail(path, "wants an absolute path ending in a name, and a uid");
    }
    const char *name = slash + 1;

    /* The parent, then the new subvolume through it: no path is looked up twice. */
    *slash = '\0';
    int parent = open(slash == path ? "/" : path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    *slash = '/';
    if (parent < 0) fail(path, "open parent");
    /* A ready writable snapshot of `source` that the host made earlier is taken by a rename, which
     * waits for no transaction commit (a snapshot does: 1.5-3.5 ms here); when it is gone (another
     * create took it) the snapshot is made here. */
    int taken = spare != NULL && renameat(AT_FDCWD, spare, parent, name) == 0;
    if (spare != NULL && !taken && errno != ENOENT) fail(spare, "take the spare clone");
    if (taken) {
        /* made already */
    } else if (source == NULL) {
        struct btrfs_ioctl_vol_args create = {0};
        strncpy(create.name, name, sizeof create.name - 1);
        if (ioctl(parent, BTRFS_IOC_SUBVOL_CREATE, &create) != 0) fail(path, "create");
    } else {
        /* A writable snapshot of `source` (a snapshot of another sandbox's workspace). */
        int from = open(source, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (from < 0) fail(source, "open the source");
        struct btrfs_ioctl_vol_args_v2 snapshot = {.fd = from};
        strncpy(snapshot.name, name, sizeof snapshot.name - 1);
        if (ioctl(parent, BTRFS_IOC_SNAP_CREATE_V2, &snapshot) != 0) fail(path, "snapshot");
        close(from);
    }
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) fail(path, "open");
    close(parent);

    /* The sandbox's alone: its uid's, 0700 (btrfs makes a subvolume root's 0755). A snapshot's
     * files keep their content and modes and become the new sandbox's, as `chown -R` would make
     * them (links themselves, never followed; nothing else mounted there yet). */
    if (source != NULL) {
        tree_owner = (uid_t)owner;
        if (nftw(path, own_entry, 32, FTW_PHYS | FTW_MOUNT) != 0) fail(path, "give its files to the sandbox's uid");
    }
    if (fchown(fd, (uid_t)owner, (gid_t)owner) != 0) fail(path, "chown");
    if (fchmod(fd, 0700) != 0) fail(path, "chmod");
    if (limit > 0) {
        /* qgroupid 0: the quota group of the subvolume fd is in (what `btrfs qgroup limit SIZE PATH` sets). */
        struct btrfs_ioctl_qgroup_limit_args quota = {.qgroupid = 0, .lim = {.flags = BTRFS_QGROUP_LIMIT_MAX_RFER, .max_rfer = limit}};
        if (ioctl(fd, BTRFS_IOC_QGROUP_LIMIT, &quota) != 0) fail(path, "set its quota limit");
    }
    close(fd);
}

void subvolume_limit_exclusive(char *spec) {
    char *colon = strchr(spec, ':');
    if (colon == NULL || colon[1] != '/') {
        fprintf(stderr, "capsule-launch: --root-limit wants LIMIT_BYTES:PATH (an absolute path)\n");
        exit(125);
    }
    *colon = '\0';
    unsigned long long limit = parse_number(spec, "limit", "--root-limit wants LIMIT_BYTES:PATH");
    const char *path = colon + 1;
    if (limit == 0) return; /* no limit, as --subvolume's 0 */
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) fail(path, "open");
    /* qgroupid 0 means the subvolume the fd is in: a plain directory would give its limit to the
     * volume's top level. A subvolume's root directory is inode 256 (BTRFS_FIRST_FREE_OBJECTID). */
    struct stat info;
    if (fstat(fd, &info) != 0) fail(path, "stat");
    if (info.st_ino != 256) {
        errno = ENOTDIR;
        fail(path, "is not a subvolume");
    }
    /* What `btrfs qgroup limit -e SIZE PATH` sets: a root shares its template's extents, and only
     * what the sandbox itself writes is exclusive to it. */
    struct btrfs_ioctl_qgroup_limit_args quota = {.qgroupid = 0, .lim = {.flags = BTRFS_QGROUP_LIMIT_MAX_EXCL, .max_excl = limit}};
    if (ioctl(fd, BTRFS_IOC_QGROUP_LIMIT, &quota) != 0) fail(path, "set its quota limit");
    close(fd);
}

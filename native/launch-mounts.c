/*
 * Host mounts for capsule-launch (see launch-mounts.h). The engine checks the same rules first
 * to give a good error early; this is the final word, taken as root right before the sandbox
 * starts, so that nothing swapped in between (a directory turned into a symlink, a FIFO put in
 * its place) is ever opened.
 *
 * Rules, in order:
 *   1. the root is opened with no symlink anywhere in its path (it is canonical at start);
 *   2. the subpath is resolved beneath the root with openat2(RESOLVE_BENEATH |
 *      RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS), as O_PATH | O_NOFOLLOW: nothing is opened
 *      for reading, so a FIFO cannot block us and a device is never opened;
 *   3. only a directory or a regular file is accepted (fstat), of the kind the caller prepared;
 *   4. its filesystem is not proc, sysfs, cgroup, devpts, debugfs, tracefs, securityfs, bpf and
 *      kin (fstatfs), and no mount of those lies below a directory (binds are recursive);
 *   5. it is not Capsule's data directory, not inside it and does not contain it (walking
 *      ".." by device and inode, which no path trick can fool).
 */
#define _GNU_SOURCE
#include "launch-mounts.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

#ifndef CONFIGFS_MAGIC
#define CONFIGFS_MAGIC 0x62656570
#endif
#ifndef FUSECTL_MAGIC
#define FUSECTL_MAGIC 0x65735543
#endif
#ifndef MQUEUE_MAGIC
#define MQUEUE_MAGIC 0x19800202
#endif

/* Kernel interfaces that are never a dataset: host state, other processes, devices, control files. */
static const unsigned long FORBIDDEN_MAGIC[] = {
    PROC_SUPER_MAGIC, SYSFS_MAGIC, CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, DEVPTS_SUPER_MAGIC,
    DEBUGFS_MAGIC, TRACEFS_MAGIC, SECURITYFS_MAGIC, BPF_FS_MAGIC, NSFS_MAGIC, CONFIGFS_MAGIC,
    EFIVARFS_MAGIC, PSTOREFS_MAGIC, FUSECTL_MAGIC, BINFMTFS_MAGIC, SELINUX_MAGIC, SMACK_MAGIC,
    MQUEUE_MAGIC, RDTGROUP_SUPER_MAGIC,
};
static const char *const FORBIDDEN_TYPES[] = {
    "proc", "sysfs", "cgroup", "cgroup2", "devpts", "debugfs", "tracefs", "securityfs", "bpf", "nsfs",
    "configfs", "efivarfs", "pstore", "fusectl", "binfmt_misc", "selinuxfs", "smackfs", "mqueue",
    "resctrl", "devtmpfs",
};

__attribute__((noreturn)) static void die_attach(const char *target, const char *step) {
    fprintf(stderr, "capsule-launch: attach %s: %s: %s\n", target, step, strerror(errno));
    exit(125);
}

static struct stat forbidden_dir;
static int forbidden_fd = -1;
/* Launcher-internal fds live up here, clear of the numbered fds it hands on (3 and up). */
#define PRIVATE_FD_MIN 200

__attribute__((noreturn)) static void refuse(const struct launch_mount *m, const char *code, const char *why) {
    fprintf(stderr, "capsule-launch: mount %d refused (%s): %s\n", m->index, code, why);
    exit(125);
}

static int same_inode(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

static int resolve_beneath(int dirfd, const char *path, uint64_t flags, uint64_t resolve) {
    struct open_how how = {.flags = flags, .mode = 0, .resolve = resolve};
    int fd;
    do fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
    while (fd < 0 && (errno == EINTR || errno == EAGAIN));
    return fd;
}

void mounts_forbid(const char *dir) {
    int fd = resolve_beneath(AT_FDCWD, dir, O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0 || fstat(fd, &forbidden_dir) != 0) {
        fprintf(stderr, "capsule-launch: open --forbid %s: %s\n", dir, strerror(errno));
        exit(125);
    }
    forbidden_fd = fcntl(fd, F_DUPFD_CLOEXEC, PRIVATE_FD_MIN);
    if (forbidden_fd < 0) {
        fprintf(stderr, "capsule-launch: --forbid %s: %s\n", dir, strerror(errno));
        exit(125);
    }
    close(fd);
}

/* Whether `target` is `ancestor` or below it: walks ".." from a directory fd up to "/". */
static int is_at_or_below(int dirfd, const struct stat *ancestor) {
    int cur = dup(dirfd);
    if (cur < 0) return 1; /* cannot tell: treat as forbidden */
    for (int hops = 0; hops < 4096; hops++) {
        struct stat st;
        if (fstat(cur, &st) != 0) break;
        if (same_inode(&st, ancestor)) {
            close(cur);
            return 1;
        }
        int up = openat(cur, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (up < 0) break;
        struct stat parent;
        int at_top = fstat(up, &parent) != 0 || same_inode(&parent, &st);
        close(cur);
        cur = up;
        if (at_top) {
            close(cur);
            return 0;
        }
    }
    close(cur);
    return 1;
}

static int forbidden_magic(int fd) {
    struct statfs fs;
    if (fstatfs(fd, &fs) != 0) return 1;
    for (size_t i = 0; i < sizeof FORBIDDEN_MAGIC / sizeof FORBIDDEN_MAGIC[0]; i++) {
        if ((unsigned long)fs.f_type == FORBIDDEN_MAGIC[i]) return 1;
    }
    return 0;
}

/* mountinfo escapes space, tab, newline and backslash as \ooo. */
static void unescape(char *s) {
    char *out = s;
    for (char *in = s; *in; in++) {
        if (in[0] == '\\' && in[1] >= '0' && in[1] <= '7' && in[2] >= '0' && in[2] <= '7' && in[3] >= '0' && in[3] <= '7') {
            *out++ = (char)((in[1] - '0') * 64 + (in[2] - '0') * 8 + (in[3] - '0'));
            in += 3;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
}

/* A mount of a forbidden type strictly below the directory at `path` (a recursive bind carries it). */
static const char *forbidden_submount(const char *path) {
    FILE *info = fopen("/proc/self/mountinfo", "re");
    if (info == NULL) return "cannot read /proc/self/mountinfo";
    size_t len = strlen(path);
    int top = len == 1; /* "/" */
    char *line = NULL;
    size_t cap = 0;
    const char *problem = NULL;
    while (problem == NULL && getline(&line, &cap, info) > 0) {
        /* id parent major:minor root MOUNTPOINT options... - TYPE source superoptions */
        static char point[4096];
        char type[64];
        const char *dash = strstr(line, " - ");
        if (dash == NULL || sscanf(line, "%*d %*d %*s %*s %4095s", point) != 1 || sscanf(dash + 3, "%63s", type) != 1) continue;
        unescape(point);
        int below = top ? strcmp(point, "/") != 0 : strncmp(point, path, len) == 0 && point[len] == '/';
        if (!below) continue;
        for (size_t i = 0; i < sizeof FORBIDDEN_TYPES / sizeof FORBIDDEN_TYPES[0]; i++) {
            if (strcmp(type, FORBIDDEN_TYPES[i]) == 0) problem = "a kernel filesystem (proc, sysfs, cgroup, devpts, ...) is mounted below it";
        }
    }
    free(line);
    fclose(info);
    return problem;
}

static void resolve_one(struct launch_mount *m) {
    const uint64_t strict = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    int root = resolve_beneath(AT_FDCWD, m->root, O_PATH | O_DIRECTORY | O_CLOEXEC, RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
    if (root < 0) refuse(m, "PERMISSION_DENIED", "the mount root is no longer an existing directory (reached without symlinks)");

    /* The parent first, so that a regular file's directory can be checked against the data dir. */
    char parent_path[4096], leaf[4096];
    if (strlen(m->sub) >= sizeof parent_path) refuse(m, "INVALID_PATH", "the subpath is too long");
    strcpy(parent_path, m->sub);
    char *slash = strrchr(parent_path, '/');
    if (slash == NULL) {
        strcpy(leaf, parent_path);
        strcpy(parent_path, ".");
    } else {
        strcpy(leaf, slash + 1);
        *slash = '\0';
        if (parent_path[0] == '\0') refuse(m, "INVALID_PATH", "the subpath must be relative to the root");
    }
    int parent = resolve_beneath(root, parent_path, O_PATH | O_DIRECTORY | O_CLOEXEC, strict);
    int fd = parent < 0 ? -1 : resolve_beneath(parent, leaf, O_PATH | O_NOFOLLOW | O_CLOEXEC, strict);
    if (fd < 0) {
        switch (errno) {
        case ENOENT: refuse(m, "INVALID_PATH", "the subpath does not exist under the root");
        case ELOOP: refuse(m, "INVALID_PATH", "the subpath goes through a symlink; name the real path under the root");
        case EXDEV: refuse(m, "INVALID_PATH", "the subpath leads out of the root");
        case ENOTDIR: refuse(m, "INVALID_PATH", "a part of the subpath is not a directory");
        default: refuse(m, "INVALID_PATH", strerror(errno));
        }
    }
    struct stat st;
    if (fstat(fd, &st) != 0) refuse(m, "INVALID_PATH", strerror(errno));
    if (S_ISLNK(st.st_mode)) refuse(m, "INVALID_PATH", "the subpath is a symlink; name the real path under the root");
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        refuse(m, "INVALID_PATH", "only directories and regular files can be mounted (this is a device, FIFO or socket)");
    }
    if ((m->kind == 'd') != (S_ISDIR(st.st_mode) != 0)) refuse(m, "INVALID_PATH", "the subpath changed type while the sandbox was created");
    if (forbidden_magic(fd)) refuse(m, "PERMISSION_DENIED", "it is on a kernel filesystem (proc, sysfs, cgroup, devpts, ...) that is never mountable");
    if (forbidden_fd >= 0) {
        if (is_at_or_below(S_ISDIR(st.st_mode) ? fd : parent, &forbidden_dir)) refuse(m, "PERMISSION_DENIED", "it is Capsule's data directory or inside it");
        if (S_ISDIR(st.st_mode) && is_at_or_below(forbidden_fd, &st)) refuse(m, "PERMISSION_DENIED", "it contains Capsule's data directory");
    }
    if (S_ISDIR(st.st_mode)) {
        char link[64], path[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof path - 1);
        if (n <= 0) refuse(m, "INVALID_PATH", "cannot tell where the directory is");
        path[n] = '\0';
        const char *problem = forbidden_submount(path);
        if (problem != NULL) refuse(m, "PERMISSION_DENIED", problem);
    }
    /* Temporaries go before the move: one of them may hold the number the result must take. */
    close(parent);
    close(root);
    if (fd != m->fd) {
        if (dup2(fd, m->fd) < 0) refuse(m, "INVALID_PATH", strerror(errno));
        close(fd);
    }
    /* bwrap reads the fd after exec: it must survive it. */
    int flags = fcntl(m->fd, F_GETFD);
    if (flags < 0 || fcntl(m->fd, F_SETFD, flags & ~FD_CLOEXEC) != 0) refuse(m, "INVALID_PATH", strerror(errno));
}

void mounts_resolve(struct launch_mount *mounts, int count) {
    for (int i = 0; i < count; i++) resolve_one(&mounts[i]);
}

/* An empty directory or file at `path` to attach the mount of `fd` on. */
static void make_mount_point(int fd, const char *path) {
    struct stat st;
    if (fstat(fd, &st) != 0) die_attach(path, "fstat");
    if (S_ISDIR(st.st_mode)) {
        if (mkdir(path, 0755) != 0 && errno != EEXIST) die_attach(path, "mkdir");
        return;
    }
    int file = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (file < 0) die_attach(path, "create");
    close(file);
}

void attach_all(const char *stage, struct launch_attach *list, int count, int userns_fd) {
    if (count == 0) return;
    int trees[count];
    /*
     * A clone of just each mount (not its submounts), detached, nosuid and nodev, read-only
     * unless asked. Cloned before the unshare: open_tree clones only a mount of the caller's own
     * namespace; the fds it came from are closed (nothing is inherited by what runs next).
     */
    for (int i = 0; i < count; i++) {
        struct launch_attach *a = &list[i];
        int tree = (int)syscall(SYS_open_tree, a->fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
        if (tree < 0) die_attach(a->target, "open_tree");
        struct mount_attr attr = {.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (a->readonly ? MOUNT_ATTR_RDONLY : 0)};
        if (a->idmap) {
            if (userns_fd < 0) die_attach(a->target, "idmap without --userns");
            attr.attr_set |= MOUNT_ATTR_IDMAP;
            attr.userns_fd = (uint64_t)userns_fd;
        }
        if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr) != 0) die_attach(a->target, "mount_setattr");
        trees[i] = fcntl(tree, F_DUPFD_CLOEXEC, PRIVATE_FD_MIN);
        if (trees[i] < 0) die_attach(a->target, "dup");
        close(tree);
        close(a->fd);
    }
    /* A mount namespace of our own, propagating nothing back to the host's. */
    if (unshare(CLONE_NEWNS) != 0) die_attach("/", "unshare(CLONE_NEWNS)");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) die_attach("/", "make / private");
    if (stage != NULL && mount("capsule-stage", stage, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64") != 0) {
        die_attach(stage, "mount tmpfs");
    }
    char path[4096];
    for (int i = 0; i < count; i++) {
        const char *target = list[i].target;
        if (target[0] != '/') {
            if (stage == NULL || snprintf(path, sizeof path, "%s/%s", stage, target) >= (int)sizeof path) die_attach(target, "relative target without --stage");
            make_mount_point(trees[i], path);
            target = path;
        }
        if (syscall(SYS_move_mount, trees[i], "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) != 0) die_attach(target, "move_mount");
        close(trees[i]);
    }
}

int make_userns(unsigned long base, unsigned long count) {
    int ready[2], go[2];
    if (pipe2(ready, O_CLOEXEC) != 0 || pipe2(go, O_CLOEXEC) != 0) die_attach("userns", "pipe");
    pid_t holder = fork();
    if (holder < 0) die_attach("userns", "fork");
    if (holder == 0) {
        /* Owned by `base`: the unprivileged bwrap that joins it must be its owner. */
        close(ready[0]);
        close(go[1]);
        char byte = 1;
        if (setgroups(0, NULL) != 0 || setresgid((gid_t)base, (gid_t)base, (gid_t)base) != 0 ||
            setresuid((uid_t)base, (uid_t)base, (uid_t)base) != 0 || unshare(CLONE_NEWUSER) != 0) {
            _exit(1);
        }
        if (write(ready[1], &byte, 1) != 1) _exit(1);
        close(ready[1]);
        (void)read(go[0], &byte, 1); /* until the parent holds the namespace */
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    char byte;
    if (read(ready[0], &byte, 1) != 1) die_attach("userns", "holder failed (user namespaces disabled?)");
    close(ready[0]);
    char path[64], map[96];
    int len = snprintf(map, sizeof map, "0 %lu %lu\n", base, count);
    const char *files[] = {"uid_map", "gid_map"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "/proc/%d/%s", (int)holder, files[i]);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, map, (size_t)len) != len) die_attach(path, "write");
        close(fd);
    }
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)holder);
    int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0) die_attach(path, "open");
    close(go[1]); /* the holder exits; the fd keeps the namespace */
    while (waitpid(holder, NULL, 0) < 0 && errno == EINTR) {}
    int kept = fcntl(ns, F_DUPFD_CLOEXEC, PRIVATE_FD_MIN);
    if (kept < 0) die_attach("userns", "dup");
    close(ns);
    return kept;
}

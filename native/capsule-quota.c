/*
 * capsule-quota: turns on btrfs quota accounting for a freshly made workspace volume.
 *
 *   capsule-quota simple MOUNTPOINT
 *
 * Simple quotas (kernel 6.7+) charge each extent to the subvolume that wrote it, so a snapshot
 * costs no backref accounting at commit (docs/decisions/022-simple-quotas.md). Debian 12's
 * btrfs-progs cannot ask for them; the ioctl can. Exits 0 when enabled, 2 when the kernel
 * does not know the mode (the caller enables full quota groups instead), 1 on any other error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/btrfs.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#ifndef BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA
#define BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA 4
#endif

int main(int argc, char **argv) {
    if (argc != 3 || strcmp(argv[1], "simple") != 0) {
        fprintf(stderr, "usage: capsule-quota simple MOUNTPOINT\n");
        return 1;
    }
    int fd = open(argv[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "capsule-quota: %s: %s\n", argv[2], strerror(errno));
        return 1;
    }
    struct btrfs_ioctl_quota_ctl_args args = {.cmd = BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA};
    if (ioctl(fd, BTRFS_IOC_QUOTA_CTL, &args) != 0) {
        int error = errno;
        fprintf(stderr, "capsule-quota: enabling simple quotas on %s: %s\n", argv[2], strerror(error));
        close(fd);
        /* An older kernel rejects the command it does not know. */
        return error == EINVAL || error == EOPNOTSUPP ? 2 : 1;
    }
    close(fd);
    return 0;
}

/*
 * Writes Capsule's seccomp filter as raw BPF to stdout, for `bwrap --seccomp FD`.
 *
 * Default allow, with EPERM for the syscalls a sandboxed program never needs and that widen the
 * kernel's attack surface or let it escape: tracing, mounts, namespaces, keyrings, BPF, perf,
 * kernel modules, clocks, io_uring. clone() with any CLONE_NEW* flag fails with EPERM; clone3()
 * fails with ENOSYS so libc falls back to clone(), whose flags a filter can inspect. A syscall of
 * a foreign architecture kills the process (libseccomp's default for a bad arch).
 *
 * Build: gcc -O2 -o seccomp-gen seccomp-gen.c -lseccomp
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

static const char *const denied[] = {
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    "unshare", "setns",
    "keyctl", "add_key", "request_key",
    "bpf", "perf_event_open", "userfaultfd", "fanotify_init",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "open_by_handle_at", "name_to_handle_at",
    "swapon", "swapoff", "reboot", "syslog", "acct", "quotactl", "quotactl_fd",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "lookup_dcookie", "nfsservctl", "vhangup", "uselib", "personality",
};

static const unsigned long new_namespace_flags[] = {
    CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET,
    CLONE_NEWCGROUP, 0x00000080 /* CLONE_NEWTIME */,
};

static void check(int rc, const char *what) {
    if (rc < 0) {
        fprintf(stderr, "seccomp-gen: %s: %s\n", what, strerror(-rc));
        exit(1);
    }
}

int main(void) {
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (ctx == NULL) {
        fprintf(stderr, "seccomp-gen: seccomp_init failed\n");
        return 1;
    }
    for (size_t i = 0; i < sizeof denied / sizeof denied[0]; i++) {
        int nr = seccomp_syscall_resolve_name(denied[i]);
        if (nr == __NR_SCMP_ERROR) continue; /* not on this architecture */
        check(seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0), denied[i]);
    }
    for (size_t i = 0; i < sizeof new_namespace_flags / sizeof new_namespace_flags[0]; i++) {
        unsigned long flag = new_namespace_flags[i];
        check(seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                               SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag)), "clone");
    }
    check(seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0), "clone3");
    /* TIOCSTI and TIOCLINUX push input into a terminal the sandbox may share with its caller. */
    check(seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                           SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, TIOCSTI)), "ioctl TIOCSTI");
    check(seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                           SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, TIOCLINUX)), "ioctl TIOCLINUX");
    /* btrfs ioctls (type 0x94): a new subvolume or snapshot would escape the workspace quota. */
    check(seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                           SCMP_A1(SCMP_CMP_MASKED_EQ, 0xff00UL, 0x9400UL)), "ioctl btrfs");
    /* On one btrfs filesystem copy_file_range clones extents (a reflink) across subvolumes and
     * bind mounts. Under simple quotas a clone stays charged to the subvolume that wrote the data,
     * so a sandbox could fill a volume from its disk (or its disk from a volume) with bytes that
     * no limit of the target counts (decision 022). ENOSYS: cp, libuv and Python copy by read
     * and write instead, which the target's quota counts. */
    check(seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(copy_file_range), 0), "copy_file_range");
    check(seccomp_export_bpf(ctx, STDOUT_FILENO), "export");
    seccomp_release(ctx);
    return 0;
}

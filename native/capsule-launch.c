/*
 * capsule-launch: the one hop between the Capsule host process and bubblewrap (or runsc).
 *
 * Node cannot join cgroups, enter a network namespace, set rlimits or drop to another uid for a
 * child it spawns, and a chain of sh + nsenter + prlimit + setpriv costs four execs. This does
 * the same in one fork, in a fixed order, then execs the target as the sandbox's host uid.
 *
 * The launcher itself stays outside the sandbox's cgroups as a child subreaper: when the sandbox
 * is killed at once through cgroup.kill, its processes' zombies come here and are reaped, instead
 * of waiting on the host's init. It exits when nothing is left, with the target's status.
 *
 * The child is forked straight into the --cgroup2-dir group (clone3 with CLONE_INTO_CGROUP):
 * migrating a running process by writing cgroup.procs waits for an RCU grace period (7-18 ms
 * measured here), a fork into the group does not. Where that is not possible (see fork_into)
 * the child is forked and joins by a write.
 *
 * With --subvolume UID:LIMIT_BYTES:PATH, first of all (launch-subvolume.c): make PATH a new btrfs
 * subvolume, owned by UID, mode 0700, its quota limit set (a sandbox's new workspace); with
 * --subvolume-from SOURCE, a writable snapshot of SOURCE whose files become UID's; with
 * --subvolume-spare SPARE as well, the ready snapshot of SOURCE at SPARE is renamed to PATH when
 * there is one (the host keeps one per snapshot; see src/host/spare-clones.host.ts). With
 * --root-limit LIMIT_BYTES:PATH, the exclusive-bytes quota limit of the existing subvolume PATH
 * (a sandbox's root from a template) is set the same way, by ioctl, before anything starts.
 *
 * In the child:
 *   1. write our pid to each --cgroup-procs file (the v1 memory, pids, cpu groups);
 *   2. set each --rlimit;
 *   3. open each --fd N:PATH read-only at fd N, as root (the seccomp program, and Capsule's own
 *      directories under its private data directory, to --attach);
 *   4. resolve each --mount (a tenant's host mount: an operator's root and a subpath) safely as
 *      root into an O_PATH fd, refusing anything but a directory or regular file beneath the root,
 *      kernel filesystems and Capsule's --forbid directory (launch-mounts.c); then, in a private
 *      mount namespace, mount a detached clone of each --attach fd at its target: under --stage
 *      (a tmpfs made there) for bwrap, which binds by path as the sandbox's uid and could not
 *      reach the 0700 data directory; at a bundle path for runsc's gofer (gVisor);
 *   5. enter --netns (a pre-made network namespace) if given;
 *   6. drop supplementary groups, set gid and uid, keep no capabilities;
 *   7. ask for SIGKILL when the parent dies (set after the uid change, which clears it);
 *   8. exec the target with the environment it was given.
 *
 *   With --userns BASE:COUNT[:FD] (a sandbox from a template, root inside): before the attaches,
 *   a user namespace owned by host uid BASE mapping 0..COUNT-1 to BASE.. is made (make_userns);
 *   an `:idmap` attach (the sandbox's root snapshot) is seen through it, so ids 0..COUNT-1 on
 *   disk are the sandbox's own 0..COUNT-1; FD keeps the namespace for bwrap --userns.
 *
 * Usage: capsule-launch [--subvolume UID:LIMIT_BYTES:PATH [--subvolume-from SOURCE [--subvolume-spare SPARE]]] [--root-limit LIMIT_BYTES:PATH] [--cgroup2-dir DIR] [--cgroup-procs FILE]... [--netns FILE] [--rlimit NAME=SOFT[:HARD]]...
 *                       [--fd N:PATH]... [--forbid DIR] [--mount I:FD:KIND ROOT SUBPATH]...
 *                       [--userns BASE:COUNT[:FD]] [--stage DIR] [--attach FD:ro|rw[:idmap] TARGET]...
 *                       [--uid N --gid N] [--supervise SOCKET --spool FILE [--spool-bytes N] [--pidfile FILE]]
 *                       -- PROGRAM ARGS...
 * KIND is d (directory) or f (regular file); SUBPATH is relative, "." for the root itself.
 * With --supervise (launch-supervise.c) the launcher is a daemon that outlives the host: its own
 * session, no death signal, the agent's stdio on pipes it relays to one client at a time over the
 * unix socket SOCKET, spooling to FILE meanwhile. It prints "ready" on stdout once the socket
 * listens, then lets go of stdin and stdout.
 *
 * Exit status 125 with a message on stderr when a step fails (the target never starts); a refused
 * mount says "capsule-launch: mount I refused (CODE): why".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch-mounts.h"
#include "launch-subvolume.h"
#include "launch-supervise.h"

static void die(const char *what, const char *arg) {
    fprintf(stderr, "capsule-launch: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    exit(125);
}

static void usage(const char *message) {
    fprintf(stderr, "capsule-launch: %s\n", message);
    exit(125);
}

static long parse_long(const char *text, const char *what) {
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') usage(what);
    return value;
}

static int rlimit_resource(const char *name) {
    if (strcmp(name, "fsize") == 0) return RLIMIT_FSIZE;
    if (strcmp(name, "nofile") == 0) return RLIMIT_NOFILE;
    if (strcmp(name, "core") == 0) return RLIMIT_CORE;
    if (strcmp(name, "nproc") == 0) return RLIMIT_NPROC;
    if (strcmp(name, "stack") == 0) return RLIMIT_STACK;
    usage("unknown rlimit name");
    return -1;
}

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif

/* struct clone_args up to `cgroup` (CLONE_ARGS_SIZE_VER2), declared here so that no kernel
 * header has to agree with glibc's <sched.h>. */
struct launch_clone_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size, cgroup;
};

static void write_pid(const char *file);

/* fork() + join `dir` by writing cgroup.procs in the child. */
static pid_t fork_then_join(const char *dir) {
    pid_t pid = fork();
    if (pid == 0) {
        char procs[4096];
        if (snprintf(procs, sizeof procs, "%s/cgroup.procs", dir) >= (int)sizeof procs) usage("cgroup dir too long");
        write_pid(procs);
    }
    return pid;
}

/*
 * fork(), with the child born in the cgroup v2 directory `dir` when one is given. The child
 * reports that it runs through a pipe: this kernel (6.18) SIGKILLs a child cloned into a group
 * whose cgroup.kill was ever used (a sandbox resumed in its old group) when the parent's group
 * was not, and such a child never gets to run. Then, and where clone3 cannot do it at all, the
 * launcher falls back to fork + a write to cgroup.procs.
 */
static pid_t fork_into(const char *dir) {
    if (dir == NULL) return fork();
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) die("open cgroup dir", dir);
    int alive[2];
    if (pipe2(alive, O_CLOEXEC) != 0) die("pipe", NULL);
    struct launch_clone_args args = {.flags = CLONE_INTO_CGROUP, .exit_signal = SIGCHLD, .cgroup = (uint64_t)fd};
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) {
        char one = 1;
        close(fd);
        close(alive[0]);
        if (write(alive[1], &one, 1) != 1) _exit(125);
        close(alive[1]);
        return 0;
    }
    int clone_errno = errno;
    close(fd);
    close(alive[1]);
    int born = 0;
    if (pid > 0) {
        char byte;
        ssize_t n;
        do n = read(alive[0], &byte, 1);
        while (n < 0 && errno == EINTR);
        born = n == 1;
        if (!born) (void)waitpid((pid_t)pid, NULL, 0);
    }
    close(alive[0]);
    if (born) return (pid_t)pid;
    /* EPERM: a seccomp profile (older container runtimes) that refuses clone3 outright. */
    if (pid > 0 || clone_errno == ENOSYS || clone_errno == E2BIG || clone_errno == EINVAL || clone_errno == EPERM) return fork_then_join(dir);
    errno = clone_errno;
    return -1;
}

static void write_pid(const char *file) {
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    if (fd < 0) die("open cgroup file", file);
    char buf[32];
    int len = snprintf(buf, sizeof buf, "%d\n", (int)getpid());
    if (write(fd, buf, (size_t)len) != len) die("join cgroup", file);
    close(fd);
}

static void set_rlimit(char *spec) {
    char *eq = strchr(spec, '=');
    if (eq == NULL) usage("--rlimit wants NAME=SOFT[:HARD]");
    *eq = '\0';
    char *soft = eq + 1;
    char *colon = strchr(soft, ':');
    char *hard = soft;
    if (colon != NULL) {
        *colon = '\0';
        hard = colon + 1;
    }
    struct rlimit limit = {
        .rlim_cur = (rlim_t)parse_long(soft, "bad rlimit value"),
        .rlim_max = (rlim_t)parse_long(hard, "bad rlimit value"),
    };
    if (setrlimit(rlimit_resource(spec), &limit) != 0) die("setrlimit", spec);
}

static void open_at(char *spec) {
    char *colon = strchr(spec, ':');
    if (colon == NULL) usage("--fd wants N:PATH");
    *colon = '\0';
    int target = (int)parse_long(spec, "bad fd number");
    if (target < 3) usage("--fd must be 3 or above");
    int fd = open(colon + 1, O_RDONLY);
    if (fd < 0) die("open", colon + 1);
    if (fd != target) {
        if (dup2(fd, target) < 0) die("dup2", colon + 1);
        close(fd);
    }
}

static int wait_all(pid_t target) {
    int target_status = 0;
    for (;;) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            if (errno == EINTR) continue;
            break; /* ECHILD: nothing of the sandbox is left */
        }
        if (pid == target) target_status = status;
    }
    if (WIFEXITED(target_status)) return WEXITSTATUS(target_status);
    if (WIFSIGNALED(target_status)) return 128 + WTERMSIG(target_status);
    return 125;
}

int main(int argc, char **argv) {
    /* Options are applied in the child; keep them until the fork. */
    char **cgroups = calloc((size_t)argc, sizeof *cgroups);
    char **rlimits = calloc((size_t)argc, sizeof *rlimits);
    char **fds = calloc((size_t)argc, sizeof *fds);
    struct launch_mount *mounts = calloc((size_t)argc, sizeof *mounts);
    struct launch_attach *attaches = calloc((size_t)argc, sizeof *attaches);
    size_t ncgroups = 0, nrlimits = 0, nfds = 0;
    int nmounts = 0, nattaches = 0;
    if (cgroups == NULL || rlimits == NULL || fds == NULL || mounts == NULL || attaches == NULL) die("calloc", NULL);
    const char *netns = NULL, *cgroup2 = NULL, *forbid = NULL, *stage = NULL;
    char *subvolume = NULL, *root_limit = NULL;
    const char *subvolume_from = NULL, *subvolume_spare = NULL;
    long uid = -1, gid = -1;
    struct supervise_options supervise_opts = {.spool_bytes = 16ull * 1024 * 1024};
    unsigned long userns_base = 0, userns_count = 0;
    int userns_keep = -1;
    int i = 1;
    for (; i < argc; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--") == 0) {
            i++;
            break;
        }
        if (i + 1 >= argc) usage("option without a value");
        if (strcmp(opt, "--mount") == 0) {
            if (i + 3 >= argc) usage("--mount wants I:FD:KIND ROOT SUBPATH");
            struct launch_mount *m = &mounts[nmounts++];
            char kind = 0;
            if (sscanf(argv[i + 1], "%d:%d:%c", &m->index, &m->fd, &kind) != 3 || (kind != 'd' && kind != 'f') || m->fd < 3) {
                usage("--mount wants I:FD:KIND (KIND d or f, FD 3 or above)");
            }
            m->kind = kind;
            m->root = argv[i + 2];
            m->sub = argv[i + 3];
            i += 3;
            continue;
        }
        if (strcmp(opt, "--attach") == 0) {
            /* --attach FD:ro|rw[:idmap] TARGET: FD is an earlier --fd or --mount fd. */
            if (i + 2 >= argc) usage("--attach wants FD:ro|rw[:idmap] TARGET");
            struct launch_attach *a = &attaches[nattaches++];
            char mode[3] = {0}, flag[8] = {0};
            int n = sscanf(argv[i + 1], "%d:%2[a-z]:%7s", &a->fd, mode, flag);
            if (n < 2 || (strcmp(mode, "ro") != 0 && strcmp(mode, "rw") != 0) || a->fd < 3 || (n == 3 && strcmp(flag, "idmap") != 0)) {
                usage("--attach wants FD:ro|rw[:idmap] (FD 3 or above)");
            }
            a->readonly = strcmp(mode, "ro") == 0;
            a->idmap = n == 3;
            a->target = argv[i + 2];
            i += 2;
            continue;
        }
        char *value = argv[++i];
        if (strcmp(opt, "--cgroup-procs") == 0) cgroups[ncgroups++] = value;
        else if (strcmp(opt, "--cgroup2-dir") == 0) cgroup2 = value;
        else if (strcmp(opt, "--netns") == 0) netns = value;
        else if (strcmp(opt, "--rlimit") == 0) rlimits[nrlimits++] = value;
        else if (strcmp(opt, "--fd") == 0) fds[nfds++] = value;
        else if (strcmp(opt, "--forbid") == 0) forbid = value;
        else if (strcmp(opt, "--stage") == 0) stage = value;
        else if (strcmp(opt, "--subvolume") == 0) subvolume = value;
        else if (strcmp(opt, "--subvolume-from") == 0) subvolume_from = value;
        else if (strcmp(opt, "--subvolume-spare") == 0) subvolume_spare = value;
        else if (strcmp(opt, "--root-limit") == 0) root_limit = value;
        else if (strcmp(opt, "--userns") == 0) {
            /* --userns BASE:COUNT[:FD]: a user namespace mapping 0..COUNT-1 to BASE..; FD keeps it for bwrap --userns. */
            int n = sscanf(value, "%lu:%lu:%d", &userns_base, &userns_count, &userns_keep);
            if (n < 2 || userns_count == 0 || userns_count > 65536 || (n == 3 && userns_keep < 3)) usage("--userns wants BASE:COUNT[:FD]");
            if (n == 2) userns_keep = -1;
        }
        else if (strcmp(opt, "--supervise") == 0) supervise_opts.socket_path = value;
        else if (strcmp(opt, "--spool") == 0) supervise_opts.spool_path = value;
        else if (strcmp(opt, "--spool-bytes") == 0) supervise_opts.spool_bytes = (unsigned long long)parse_long(value, "bad --spool-bytes");
        else if (strcmp(opt, "--pidfile") == 0) supervise_opts.pid_path = value;
        else if (strcmp(opt, "--uid") == 0) uid = parse_long(value, "bad uid");
        else if (strcmp(opt, "--gid") == 0) gid = parse_long(value, "bad gid");
        else usage("unknown option");
    }
    if (i >= argc) usage("no program to run");

    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) die("prctl subreaper", NULL);
    /* Before anything starts (and before a supervisor says it is ready): the child's --fd opens it. */
    if (subvolume_from != NULL && subvolume == NULL) usage("--subvolume-from wants --subvolume");
    if (subvolume_spare != NULL && subvolume_from == NULL) usage("--subvolume-spare wants --subvolume-from");
    if (subvolume != NULL) subvolume_create(subvolume, subvolume_from, subvolume_spare);
    if (root_limit != NULL) subvolume_limit_exclusive(root_limit);
    int supervising = supervise_opts.socket_path != NULL;
    int listen_fd = -1, sigfd = -1, agent_in[2] = {-1, -1}, agent_out[2] = {-1, -1};
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (supervising) {
        /* A daemon of its own: no death signal tied to the host, a session of its own. */
        if (supervise_opts.spool_path == NULL) usage("--supervise wants --spool FILE");
        (void)setsid();
        listen_fd = supervise_listen(supervise_opts.socket_path);
        if (listen_fd < 0) die("listen on", supervise_opts.socket_path);
        if (pipe2(agent_in, O_CLOEXEC) != 0 || pipe2(agent_out, O_CLOEXEC) != 0) die("pipe", NULL);
        sigprocmask(SIG_BLOCK, &chld, NULL);
        sigfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
        if (sigfd < 0) die("signalfd", NULL);
    } else {
        pid_t host = getppid();
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) die("prctl", NULL);
        if (getppid() != host) exit(125); /* the host died before the death signal was armed */
    }

    pid_t child = fork_into(cgroup2);
    if (child < 0) die("fork into cgroup", cgroup2);
    if (child > 0 && supervising) {
        close(agent_in[0]);
        close(agent_out[1]);
        signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error, not our death */
        if (supervise_opts.pid_path != NULL) {
            FILE *pidfile = fopen(supervise_opts.pid_path, "we");
            if (pidfile == NULL || fprintf(pidfile, "%d\n", (int)getpid()) < 0 || fclose(pidfile) != 0) die("write pidfile", supervise_opts.pid_path);
        }
        /* Tell the host it may connect, then hold nothing of it but stderr (its log file). */
        if (write(STDOUT_FILENO, "ready\n", 6) != 6) die("write ready", NULL);
        int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null_fd >= 0) {
            dup2(null_fd, STDIN_FILENO);
            dup2(null_fd, STDOUT_FILENO);
            close(null_fd);
        }
        if (chdir("/") != 0) die("chdir", "/");
        supervise(&supervise_opts, listen_fd, agent_in[1], agent_out[0], sigfd, child);
    }
    if (child > 0) {
        /* The agent's pipes belong to the sandbox: the host must see EOF when the agent dies. */
        int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null_fd >= 0) {
            dup2(null_fd, STDIN_FILENO);
            dup2(null_fd, STDOUT_FILENO);
            close(null_fd);
        }
        return wait_all(child);
    }
    if (supervising) {
        sigprocmask(SIG_UNBLOCK, &chld, NULL);
        if (dup2(agent_in[0], STDIN_FILENO) < 0 || dup2(agent_out[1], STDOUT_FILENO) < 0) die("dup2", "agent pipes");
        int ours[] = {listen_fd, sigfd, agent_in[0], agent_in[1], agent_out[0], agent_out[1]};
        for (size_t k = 0; k < sizeof ours / sizeof ours[0]; k++) close(ours[k]);
    }

    for (size_t k = 0; k < ncgroups; k++) write_pid(cgroups[k]);
    for (size_t k = 0; k < nrlimits; k++) set_rlimit(rlimits[k]);
    /* Mounts first: their fds are checked and numbered before anything else takes a number. */
    if (forbid != NULL) mounts_forbid(forbid);
    mounts_resolve(mounts, nmounts);
    for (size_t k = 0; k < nfds; k++) open_at(fds[k]);
    int userns = userns_count > 0 ? make_userns(userns_base, userns_count) : -1;
    attach_all(stage, attaches, nattaches, userns);
    if (userns >= 0 && userns_keep >= 0) {
        /* bwrap --userns FD joins it; everything else of ours is CLOEXEC. */
        if (dup2(userns, userns_keep) < 0) die("dup2", "userns");
        close(userns);
    } else if (userns >= 0) {
        close(userns);
    }
    if (netns != NULL) {
        int fd = open(netns, O_RDONLY | O_CLOEXEC);
        if (fd < 0) die("open netns", netns);
        if (setns(fd, CLONE_NEWNET) != 0) die("setns", netns);
        close(fd);
    }
    if (gid >= 0) {
        if (setgroups(0, NULL) != 0) die("setgroups", NULL);
        if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0) die("setgid", NULL);
    }
    if (uid >= 0 && setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0) die("setuid", NULL);

    pid_t parent = getppid();
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) die("prctl", NULL);
    if (getppid() != parent) _exit(125); /* the launcher died before the death signal was armed */

    execv(argv[i], &argv[i]);
    die("exec", argv[i]);
    return 125;
}

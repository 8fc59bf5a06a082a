/*
 * A sandbox's fresh workspace for capsule-launch: a btrfs subvolume made by ioctl, owned by the
 * sandbox's uid, mode 0700, with its quota limit, before anything of the sandbox starts. The host
 * would otherwise spawn `btrfs subvolume create` and `btrfs qgroup limit` (two processes, ~3 ms
 * of a ~15 ms create here) for what are two ioctls.
 */
#ifndef CAPSULE_LAUNCH_SUBVOLUME_H
#define CAPSULE_LAUNCH_SUBVOLUME_H

/*
 * `spec` is UID:LIMIT_BYTES:PATH (LIMIT_BYTES 0 for no limit). PATH must not exist; its parent is
 * a directory on a btrfs filesystem with quotas enabled when a limit is asked. Exits 125 with
 * "capsule-launch: subvolume PATH: why" on stderr when a step fails; what it made stays for the
 * host to delete (it deletes the workspace of a sandbox that failed to start).
 */
void subvolume_create(char *spec);

#endif

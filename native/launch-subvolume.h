/*
 * A sandbox's new workspace for capsule-launch: a btrfs subvolume (empty, or a snapshot of another
 * sandbox's) made by ioctl, owned by the sandbox's uid, mode 0700, with its quota limit, before
 * anything of the sandbox starts. The host would otherwise spawn `btrfs subvolume create` (or
 * `snapshot` and `chown -R`) and `btrfs qgroup limit` (~3 ms of a ~15 ms create here, each spawn
 * ~1 ms of the server's event loop) for what are a few syscalls.
 */
#ifndef CAPSULE_LAUNCH_SUBVOLUME_H
#define CAPSULE_LAUNCH_SUBVOLUME_H

/*
 * `spec` is UID:LIMIT_BYTES:PATH (LIMIT_BYTES 0 for no limit). PATH must not exist; its parent is
 * a directory on a btrfs filesystem with quotas enabled when a limit is asked. With `source` (a
 * subvolume on the same filesystem) PATH is a writable snapshot of it whose files all become
 * UID's; else it is empty. With `spare` (a writable snapshot of `source` made earlier, on the same
 * filesystem) that subvolume is renamed to PATH instead when it exists, and PATH is made a
 * snapshot of `source` when it does not (another create took it). Exits 125 with
 * "capsule-launch: subvolume PATH: why" on stderr when a step fails; what it made stays for the host to delete (it deletes the workspace of a sandbox
 * that failed to start).
 */
void subvolume_create(char *spec, const char *source, const char *spare);

/*
 * `spec` is LIMIT_BYTES:PATH: the exclusive-bytes quota limit of the subvolume at PATH (a sandbox's
 * root from a template, which shares the template's extents: only what the sandbox writes counts),
 * set by ioctl where the host would spawn `btrfs qgroup limit -e` (0: none). PATH must be a
 * subvolume, not a directory in one. Exits 125 as subvolume_create.
 */
void subvolume_limit_exclusive(char *spec);

#endif

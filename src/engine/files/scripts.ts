/**
 * The in-sandbox halves of the file operations. Each is a constant POSIX sh script run as
 * `sh -c SCRIPT sh ARGS...`: paths only ever arrive as positional arguments, never as script text.
 * Failures print the tool's own errno text on stderr (or an equivalent `capsule: PATH: <strerror>`
 * line) for `classifyFailure`.
 */

/** `parents DIR`: mkdir -p, except that a file in the way is reported as ENOTDIR (not EEXIST). */
const PARENTS = `parents() {
  if [ -e "$1" ] && [ ! -d "$1" ]; then printf 'capsule: %s: Not a directory\\n' "$1" >&2; return 1; fi
  mkdir -p -- "$1"
}`;

/** Prefix of the temporary file a write fills before renaming it over the target. */
export const UPLOAD_TEMP_PREFIX = '.capsule-upload-';

/**
 * write: $1 path, $2 find format, $3 temp file name (random, from the host). Resolves the path as the sandbox sees it (a symlink is written
 * through, to its target inside the sandbox), creates the parents, then reads frames from stdin:
 * a line with a byte count n, then n bytes, appended to a temp file next to the target; a `.` on
 * stdout acknowledges each frame (the host's flow control). A count of 0 ends the upload: the temp
 * file is renamed over the target (atomic: readers see the old or the new file), and `=` and the
 * target's entry follow. `head -c` reads exactly n bytes, so frames never run into each other. A
 * head killed by SIGXFSZ (limits.fileSizeBytes) makes the script exit 153. SIGTERM, or stdin ending
 * without the 0 frame, removes the temp file: the traps are set before the file exists and its
 * name is known before it is created (noclobber, so an existing file is never taken over), so no
 * moment of an abort leaves it behind. The cleanup ignores TERM, and so does its rm: the agent
 * signals every process of the session, and a rm it caught mid-way would leave the file. Only
 * SIGKILL (after the grace period) or a crash can leave it.
 */
export const WRITE_SCRIPT = `${PARENTS}
trap 'exit 143' TERM
trap 'exit 129' HUP
tmp=
trap 'trap "" TERM HUP; [ -z "$tmp" ] || rm -f -- "$tmp"' EXIT
t=$(realpath -m -- "$1" && echo .) || exit 1
t=\${t%??}
if [ -d "$t" ]; then printf 'capsule: %s: Is a directory\\n' "$t" >&2; exit 1; fi
d=\${t%/*}
d=\${d:-/}
parents "$d" || exit 1
tmp=\${d%/}/$3
set -C
: > "$tmp" || { tmp=; exit 1; }
set +C
n=
while IFS= read -r n; do
  [ "$n" = 0 ] && break
  head -c "$n" >> "$tmp" || exit
  printf .
done
[ "$n" = 0 ] || { printf 'capsule: %s: the upload ended before its last frame\\n' "$t" >&2; exit 1; }
if [ -f "$t" ]; then chmod --reference="$t" -- "$tmp"; else chmod 644 -- "$tmp"; fi || exit 1
mv -f -T -- "$tmp" "$t" || exit 1
tmp=
printf =
exec find "$t" -maxdepth 0 -printf "$2"
`;

/** Exit status of LIST_SCRIPT when the directory itself cannot be listed (its stderr says why). */
export const LIST_ROOT_STATUS = 3;

/**
 * list: $1 directory, $2 depth, $3 find format. The directory itself may be a symlink (-H follows
 * it); entries below are reported, not followed. Errors on the directory itself fail the call
 * (LIST_ROOT_STATUS); entries that cannot be read or vanish during the walk are left out (find
 * exits 1 for those).
 */
export const LIST_SCRIPT = `
find -H "$1" -maxdepth 0 -printf '' || exit ${LIST_ROOT_STATUS}
[ -d "$1" ] || { printf 'capsule: %s: Not a directory\\n' "$1" >&2; exit ${LIST_ROOT_STATUS}; }
{ [ -r "$1" ] && [ -x "$1" ]; } || { printf 'capsule: %s: Permission denied\\n' "$1" >&2; exit ${LIST_ROOT_STATUS}; }
exec find -H "$1" -mindepth 1 -maxdepth "$2" -printf "$3"
`;

/** mkdir: $1 directory, $2 its parent, $3 find format. Parents are created; the directory must not exist. */
export const MKDIR_SCRIPT = `${PARENTS}
parents "$2" || exit 1
mkdir -- "$1" || exit 1
exec find "$1" -maxdepth 0 -printf "$3"
`;

/** Exit status of MOVE_SCRIPT when the source is the problem (its stderr says why). */
export const MOVE_SOURCE_STATUS = 3;

/**
 * move: $1 source, $2 destination, $3 the destination's parent, $4 find format. rename(2)
 * semantics, like E2B's Move: an existing file or empty directory at the destination is replaced;
 * a directory is never moved *into* an existing directory (mv -T).
 */
export const MOVE_SCRIPT = `${PARENTS}
find "$1" -maxdepth 0 -printf '' || exit ${MOVE_SOURCE_STATUS}
parents "$3" || exit 1
mv -f -T -- "$1" "$2" || exit 1
exec find "$2" -maxdepth 0 -printf "$4"
`;

/** inotify events reported by watch, in inotifywait's names. */
export const WATCH_EVENTS = 'create,modify,attrib,delete,delete_self,move,move_self';

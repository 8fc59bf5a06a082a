/**
 * Reading `btrfs receive --dump` (the commands of `btrfs send --no-data -p ORIGIN SNAPSHOT`): each
 * line is an operation, the path it acts on and `key=value` attributes. Paths are escaped the way
 * btrfs-progs prints them (`\ ` for a space, `\n`, `\\`, `\ooo` for other unprintable bytes).
 * What matters here is only which paths an operation touched: whether and how each one changed is
 * decided by comparing the two trees (see tree-diff), so a rename through an orphan name, a hard
 * link, a chown or a utimes all reduce to "look at these paths".
 */

const ESCAPES: Record<string, number> = { a: 7, b: 8, e: 27, f: 12, n: 10, r: 13, t: 9, v: 11, ' ': 32, '\\': 92 };

/** Splits a dump line into fields at unescaped whitespace, undoing the escapes (bytes, then UTF-8). */
export function splitDumpLine(line: string): string[] {
  const fields: string[] = [];
  let bytes: number[] = [];
  let inField = false;
  const end = () => {
    if (inField) fields.push(Buffer.from(bytes).toString('utf8'));
    bytes = [];
    inField = false;
  };
  for (let i = 0; i < line.length; i++) {
    const c = line[i]!;
    if (c === ' ' || c === '\t') {
      end();
      continue;
    }
    inField = true;
    if (c !== '\\' || i + 1 >= line.length) {
      bytes.push(...Buffer.from(c, 'utf8'));
      continue;
    }
    const next = line[i + 1]!;
    const octal = /^[0-7]{3}$/.exec(line.slice(i + 1, i + 4));
    if (octal) {
      bytes.push(parseInt(octal[0], 8));
      i += 3;
    } else if (ESCAPES[next] !== undefined) {
      bytes.push(ESCAPES[next]);
      i += 1;
    } else {
      bytes.push(92);
    }
  }
  end();
  return fields;
}

export interface DumpOperation {
  op: string;
  /** Path relative to the subvolume's root (no leading `./name/`). */
  path: string;
  attributes: Record<string, string>;
}

/** Parses one line; `prefix` is `./<subvolume name>/` from the stream's first line. */
export function parseDumpLine(line: string, prefix: string): DumpOperation | undefined {
  const [op, rawPath, ...rest] = splitDumpLine(line);
  if (op === undefined || rawPath === undefined) return undefined;
  const attributes: Record<string, string> = {};
  for (const field of rest) {
    const eq = field.indexOf('=');
    if (eq > 0) attributes[field.slice(0, eq)] = field.slice(eq + 1);
  }
  return { op, path: stripPrefix(rawPath, prefix), attributes };
}

function stripPrefix(path: string, prefix: string): string {
  if (path.startsWith(prefix)) return path.slice(prefix.length);
  if (`${path}/` === prefix) return '';
  return path.replace(/^\.\//, '');
}

/**
 * Collects the paths a dump touches, relative to the subvolume root, until `limit` is reached.
 * Feed it the dump's lines in order.
 */
export class TouchedPaths {
  readonly paths = new Set<string>();
  /** More paths were touched than `limit`: the set is incomplete. */
  truncated = false;
  private prefix = './';

  constructor(private readonly limit: number) {}

  push(line: string): void {
    if (line.trim() === '') return;
    const first = splitDumpLine(line);
    if (first[0] === 'snapshot' || first[0] === 'subvol') {
      // The stream names the subvolume first: every later path starts with `./<name>/`.
      this.prefix = `${first[1] ?? '.'}/`;
      return;
    }
    const operation = parseDumpLine(line, this.prefix);
    if (!operation) return;
    this.add(operation.path);
    const dest = operation.attributes.dest;
    // rename's dest is a path in the tree; link's dest is the existing name, relative to the
    // root; symlink's dest is the link's target, not a path of the tree.
    if (dest !== undefined && operation.op === 'rename') this.add(stripPrefix(dest, this.prefix));
    if (dest !== undefined && operation.op === 'link') this.add(dest);
  }

  private add(path: string): void {
    // btrfs send's temporary names (`o<ino>-<gen>-<n>`) are kept: they exist in neither tree, so
    // the comparison drops them, while a real file of that name is still seen.
    if (path === '') return;
    if (this.paths.has(path)) return;
    if (this.paths.size >= this.limit) {
      this.truncated = true;
      return;
    }
    this.paths.add(path);
  }
}

/**
 * `.dockerignore` as Docker reads it (moby/patternmatcher): one pattern a line, `#` comments,
 * `!` exceptions, Go filepath.Match wildcards per path segment (`*`, `?`, `[…]`) plus `**` for any
 * number of directories. Patterns apply in order and the last one that matches decides; a pattern
 * matches a path when it matches the path itself or one of its parent directories.
 */
export interface IgnorePattern {
  exclusion: boolean;
  regex: RegExp;
  source: string;
}

export function parseDockerignore(text: string): IgnorePattern[] {
  const patterns: IgnorePattern[] = [];
  for (const raw of text.split(/\r?\n/)) {
    let line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const exclusion = line.startsWith('!');
    if (exclusion) line = line.slice(1).trim();
    const cleaned = cleanPath(line);
    if (cleaned === '') continue;
    patterns.push({ exclusion, regex: patternRegex(cleaned), source: raw.trim() });
  }
  return patterns;
}

/** True when `relPath` (posix, relative to the context, no leading `/`) is excluded. */
export function isIgnored(relPath: string, patterns: readonly IgnorePattern[]): boolean {
  const parents: string[] = [];
  const parts = relPath.split('/');
  for (let i = 1; i < parts.length; i++) parents.push(parts.slice(0, i).join('/'));
  let ignored = false;
  for (const pattern of patterns) {
    const matches = pattern.regex.test(relPath) || parents.some((p) => pattern.regex.test(p));
    if (matches) ignored = !pattern.exclusion;
  }
  return ignored;
}

/** True when some exception pattern could re-include something under an excluded directory. */
export function hasExceptions(patterns: readonly IgnorePattern[]): boolean {
  return patterns.some((p) => p.exclusion);
}

/** filepath.Clean without a leading `/` (patterns are relative to the context root). */
function cleanPath(path: string): string {
  const out: string[] = [];
  for (const part of path.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') out.pop();
    else out.push(part);
  }
  return out.join('/');
}

/** A Go filepath.Match pattern (plus `**`) as an anchored regex over posix relative paths. */
export function patternRegex(pattern: string): RegExp {
  let re = '^';
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === '*') {
      if (pattern[i + 1] === '*') {
        i++;
        if (pattern[i + 1] === '/') {
          i++;
          re += '(?:.*/)?';
        } else re += '.*';
      } else re += '[^/]*';
    } else if (c === '?') re += '[^/]';
    else if (c === '[') {
      const close = pattern.indexOf(']', i + 2);
      if (close < 0) re += '\\[';
      else {
        re += `[${pattern.slice(i + 1, close).replace(/\\/g, '\\\\')}]`;
        i = close;
      }
    } else if (c === '\\' && i + 1 < pattern.length) {
      re += escapeRegex(pattern[++i]!);
    } else re += escapeRegex(c);
  }
  return new RegExp(`${re}$`);
}

function escapeRegex(c: string): string {
  return /[.*+?^${}()|[\]\\/]/.test(c) ? `\\${c}` : c;
}

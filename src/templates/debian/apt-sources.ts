/**
 * The host's apt sources, as mmdebstrap takes them: each file passed as a MIRROR argument is
 * pasted verbatim (one-line `.list` and deb822 `.sources` alike), so a bootstrap uses exactly the
 * mirrors the operator configured and never a hard-coded one (R1 §3). For a suite other than the
 * host's, the suites in each file are renamed (`bookworm-updates` → `trixie-updates`); URIs,
 * components and keys stay.
 */

export interface SourceFile {
  /** The host file it came from. */
  path: string;
  text: string;
}

/** Which files of /etc/apt are sources: sources.list and sources.list.d/*.list|*.sources. */
export function isSourceFileName(name: string): boolean {
  return name.endsWith('.list') || name.endsWith('.sources');
}

/** The file's text with every suite `from`, `from-*` renamed to `to`, `to-*`; other suites kept. */
export function renameSuite(text: string, from: string, to: string): string {
  const rename = (suite: string) => (suite === from ? to : suite.startsWith(`${from}-`) ? `${to}${suite.slice(from.length)}` : suite);
  return text
    .split('\n')
    .map((line) => {
      const deb822 = /^(Suites:\s*)(.*)$/i.exec(line);
      if (deb822) return deb822[1] + deb822[2]!.split(/\s+/).filter(Boolean).map(rename).join(' ');
      const oneLine = /^(\s*deb(?:-src)?\s+(?:\[[^\]]*\]\s+)?\S+\s+)(\S+)(.*)$/.exec(line);
      if (oneLine) return oneLine[1]! + rename(oneLine[2]!) + oneLine[3]!;
      return line;
    })
    .join('\n');
}

/** Keyring files the sources name (`Signed-By:` paths, `[signed-by=…]`), for copying into the root. */
export function signedByPaths(text: string): string[] {
  const paths = new Set<string>();
  for (const match of text.matchAll(/^Signed-By:\s*(\/\S+)\s*$/gim)) paths.add(match[1]!);
  for (const match of text.matchAll(/\[[^\]]*signed-by=(\/[^\s\]]+)[^\]]*\]/gi)) paths.add(match[1]!);
  return [...paths];
}

/** True when the file enables at least one source (a file of comments only is skipped). */
export function hasSources(text: string): boolean {
  return text.split('\n').some((line) => /^\s*(deb|deb-src)\s/.test(line) || /^\s*Types:\s*\S/i.test(line));
}

/** The codename in /etc/os-release text (`VERSION_CODENAME=bookworm`). */
export function osCodename(osRelease: string): string | undefined {
  return /^VERSION_CODENAME=["']?([a-z0-9-]+)["']?$/m.exec(osRelease)?.[1];
}

/**
 * The hosts (with their ports) the sources download from: what a build's RUN steps may reach by
 * default, so `apt-get install` works in a step and nothing else does.
 */
export function aptSourceHosts(text: string): string[] {
  const uris: string[] = [];
  for (const match of text.matchAll(/^URIs:\s*(.+)$/gim)) uris.push(...match[1]!.trim().split(/\s+/));
  for (const match of text.matchAll(/^\s*deb(?:-src)?\s+(?:\[[^\]]*\]\s+)?(\S+)/gm)) uris.push(match[1]!);
  const hosts = new Set<string>();
  for (const uri of uris) {
    try {
      const url = new URL(uri);
      if (url.protocol !== 'http:' && url.protocol !== 'https:') continue;
      hosts.add(`${url.hostname}:${url.port || (url.protocol === 'https:' ? '443' : '80')}`);
    } catch {
      // Not a URL (a cdrom: or file: source): nothing to reach over the network.
    }
  }
  return [...hosts].sort();
}

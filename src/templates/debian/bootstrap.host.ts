import { readdir, readFile, writeFile } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import { pathExists } from '../../host/fs-util.js';
import { runToolJob } from '../tool-job.host.js';
import { hasSources, isSourceFileName, osCodename, renameSuite, signedByPaths } from './apt-sources.js';
import { mmdebstrapArgv, UNSHARE_MOUNT } from './mmdebstrap-args.js';

export interface HostSources {
  /** The files to pass to mmdebstrap (the host's own, or rewritten copies in the temp dir). */
  files: string[];
  /** Keyrings they name that are not the Debian archive's own. */
  keyrings: string[];
  hostSuite: string | undefined;
}

/**
 * The host's apt sources for `suite`: /etc/apt/sources.list and sources.list.d/*.list|*.sources
 * that enable something. For the host's own suite the files are passed as they are; for another
 * one, renamed copies are written into `tempDir`.
 */
export async function hostAptSources(suite: string, tempDir: string, etcApt = '/etc/apt'): Promise<HostSources> {
  const hostSuite = osCodename(await readFile('/etc/os-release', 'utf8').catch(() => ''));
  const candidates = [join(etcApt, 'sources.list')];
  const dir = join(etcApt, 'sources.list.d');
  for (const name of (await readdir(dir).catch(() => [] as string[])).sort()) if (isSourceFileName(name)) candidates.push(join(dir, name));
  const files: string[] = [];
  const keyrings = new Set<string>();
  for (const path of candidates) {
    const text = await readFile(path, 'utf8').catch(() => undefined);
    if (text === undefined || !hasSources(text)) continue;
    for (const key of signedByPaths(text)) if (!key.startsWith('/usr/share/keyrings/debian-archive-') && (await pathExists(key))) keyrings.add(key);
    if (hostSuite === undefined || hostSuite === suite) {
      files.push(path);
      continue;
    }
    const copy = join(tempDir, `${files.length}-${basename(path)}`);
    await writeFile(copy, renameSuite(text, hostSuite, suite), { mode: 0o600 });
    files.push(copy);
  }
  if (files.length === 0) {
    throw new SandboxError('HOST_NOT_READY', `the host has no apt sources in ${etcApt}; a Debian bootstrap uses the host's sources and names no mirror itself`, {
      hint: 'Configure apt on the host (/etc/apt/sources.list.d/debian.sources) so that apt-get update works there.',
    });
  }
  return { files, keyrings: [...keyrings], hostSuite };
}

export interface RunBootstrapOptions {
  suite: string;
  packages: readonly string[];
  /** An empty subvolume. */
  target: string;
  /** A directory of this bootstrap's own (TMPDIR, rewritten sources); the caller removes it. */
  tempDir: string;
  launcher: string;
  cgroupPrefix: string;
  onLine: (line: string) => void;
  signal?: AbortSignal;
  timeoutMs?: number;
}

/**
 * Runs mmdebstrap into `target` as a job of its own (cgroup, mount namespace, TMPDIR under
 * `tempDir`). Its progress lines go to `onLine`; a failure is BUILD_FAILED with the last lines.
 */
export async function runBootstrap(options: RunBootstrapOptions): Promise<void> {
  const sources = await hostAptSources(options.suite, options.tempDir);
  const argv = [...UNSHARE_MOUNT, ...mmdebstrapArgv({ suite: options.suite, packages: options.packages, target: options.target, sources: sources.files, keyrings: sources.keyrings })];
  const result = await runToolJob({
    argv,
    launcher: options.launcher,
    cgroupPrefix: options.cgroupPrefix,
    env: { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', TMPDIR: options.tempDir, HOME: options.tempDir, LANG: 'C.UTF-8' },
    onLine: (line) => options.onLine(line),
    signal: options.signal,
    timeoutMs: options.timeoutMs,
  });
  if (result.exitCode !== 0) {
    const tail = result.stderrTail.slice(-8);
    throw new SandboxError('BUILD_FAILED', `mmdebstrap failed (exit ${result.exitCode}) bootstrapping ${options.suite}: ${tail.at(-1) ?? 'no output'}`, {
      details: { step: 'base', exitCode: result.exitCode, lastLines: tail },
      hint: 'Check that the packages exist in the suite and that the host can reach its apt mirrors (apt-get update on the host).',
    });
  }
}

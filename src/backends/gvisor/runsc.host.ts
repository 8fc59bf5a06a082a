import { access, constants, lstat, mkdir, open, symlink } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import { runCommand, type CommandResult } from '../../host/run-command.host.js';
import { buildRunscFlags, type RunscFlagsOptions, type RunscPlatform } from './oci-bundle.js';

const RUNSC_CANDIDATES = ['/usr/bin/runsc', '/usr/local/bin/runsc', '/usr/sbin/runsc'];
/** runsc subcommands other than run/restore are short; a hung one must not hang Capsule. */
const RUNSC_COMMAND_TIMEOUT_MS = 30_000;

export interface RunscInfo {
  binary: string;
  version: string;
  platform: RunscPlatform;
}

/** Finds runsc and the fastest platform it offers here (systrap, else ptrace; kvm hangs here). */
export async function probeRunsc(): Promise<RunscInfo> {
  let binary: string | undefined;
  for (const candidate of RUNSC_CANDIDATES) {
    if (await isExecutable(candidate)) {
      binary = candidate;
      break;
    }
  }
  if (binary === undefined) {
    throw new SandboxError('BACKEND_UNAVAILABLE', 'runsc (gVisor) is not installed', {
      hint: 'Run scripts/setup.sh: it installs runsc from bookworm-backports.',
    });
  }
  const version = (await runCommand([binary, '--version'])).stdout.split('\n')[0]?.trim() ?? 'unknown';
  const platforms = (await runCommand([binary, 'help', 'platforms'], { check: false })).stdout;
  const platform: RunscPlatform = /^\s*systrap\b/m.test(platforms) ? 'systrap' : 'ptrace';
  return { binary, version, platform };
}

/** One Capsule instance's runsc: its state directory, platform and debug settings. */
export class Runsc {
  constructor(
    readonly binary: string,
    private readonly flags: Omit<RunscFlagsOptions, 'network'>,
  ) {}

  /** Global flags for one sandbox (its network mode is part of them). */
  flagsFor(network: RunscFlagsOptions['network']): string[] {
    return buildRunscFlags({ ...this.flags, network });
  }

  /** Ids of the containers in this instance's state directory. */
  async list(): Promise<string[]> {
    const result = await this.command(['list', '--quiet'], { check: false });
    if (result.exitCode !== 0) return [];
    return result.stdout.split('\n').map((line) => line.trim()).filter((line) => line.length > 0);
  }

  /**
   * Saves the container's memory and processes to `imageDir`; the container stops. Uncompressed:
   * flate costs ~10 ms of CPU per MiB here, which is most of a checkpoint, and disk is cheaper.
   */
  async checkpoint(id: string, imageDir: string): Promise<void> {
    await this.command(['checkpoint', '--compression=none', `--image-path=${imageDir}`, id]);
  }

  /** Kills whatever is left of a container and removes its state. Absent containers are fine. */
  async deleteForce(id: string): Promise<void> {
    const result = await this.command(['delete', '--force', id], { check: false });
    if (result.exitCode !== 0 && !/does not exist|not found|no such/i.test(result.stderr)) {
      throw new SandboxError('INTERNAL', `runsc delete ${id} failed: ${result.stderr.trim()}`);
    }
  }

  private command(args: string[], options: { check?: boolean } = {}): Promise<CommandResult> {
    return runCommand([this.binary, ...this.flagsFor('none'), ...args], { timeoutMs: RUNSC_COMMAND_TIMEOUT_MS, ...options });
  }
}

/**
 * The read-only root of one sandbox: empty mount points for every bind of its OCI spec and the
 * usr-merge symlinks. gVisor cannot create mount points in a read-only root, so they exist here.
 */
export async function writeRootfs(rootfsDir: string, mountPoints: readonly { path: string; kind: 'dir' | 'file' }[]): Promise<void> {
  await mkdir(rootfsDir, { recursive: true, mode: 0o755 });
  for (const dir of ['usr', 'etc', 'tmp', 'workspace', 'home', 'proc', 'dev', 'var', '.capsule']) {
    await mkdir(join(rootfsDir, dir), { recursive: true, mode: 0o755 });
  }
  const links: [string, string][] = [
    ['bin', 'usr/bin'], ['sbin', 'usr/sbin'], ['lib', 'usr/lib'], ['lib64', 'usr/lib64'],
    ['home/user', '/workspace'], ['var/tmp', '../tmp'],
  ];
  for (const [path, target] of links) {
    if (!(await lstat(join(rootfsDir, path)).catch(() => undefined))) await symlink(target, join(rootfsDir, path));
  }
  for (const { path, kind } of mountPoints) await makeMountPoint(join(rootfsDir, path), kind);
}

/**
 * An empty directory or file to mount on; missing parents are made with the same directory mode.
 * @param dirMode 0o755 inside a sandbox's root (its user traverses it), 0o700 elsewhere
 */
export async function makeMountPoint(path: string, kind: 'dir' | 'file', dirMode = 0o755): Promise<void> {
  if (kind === 'dir') {
    await mkdir(path, { recursive: true, mode: dirMode });
    return;
  }
  await mkdir(dirname(path), { recursive: true, mode: dirMode });
  await (await open(path, 'a', 0o600)).close();
}

async function isExecutable(path: string): Promise<boolean> {
  try {
    await access(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

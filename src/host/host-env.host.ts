import { spawnSync } from 'node:child_process';
import { chmod, copyFile, mkdir, readdir, rename, writeFile } from 'node:fs/promises';
import { accessSync, closeSync, constants, existsSync, openSync, readdirSync, statSync } from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import { join, resolve } from 'node:path';
import { CGROUP_PREFIX } from './cgroups.host.js';
import { favorCgroupMigrations, type CgroupMigrations } from './cgroup-migrations.host.js';
import { SandboxError } from '../errors/index.js';
import { ETC_ALLOWLIST, SANDBOX_UID, SANDBOX_USER, STAGE_DIR } from './sandbox-layout.js';
import { WorkspaceVolume } from './volume.host.js';
import { UidRanges } from './uid-ranges.js';
import { prepareSandboxEtc } from './sandbox-etc.host.js';
import { packageRoot } from './fs-util.js';
import { DATA_DIR_MODE, privatizeDataDir } from './private-data.host.js';

export interface HostEnvironmentOptions {
  /** Where Capsule keeps its state. @default '/var/lib/capsule' */
  dataDir?: string;
  /** Directory of the compiled C helpers. @default dist/native of this package */
  nativeDir?: string;
  /** Sparse size of the workspace volume. @default 32 GiB */
  volumeBytes?: number;
  /**
   * Turn on the cgroup2 mount option `favordynmods` when preparing the host, so that a sandbox
   * start's cgroup migration does not wait for an RCU grace period (cgroup-migrations.host.ts).
   * @default true, unless the environment has CAPSULE_CGROUP_FAVORDYNMODS=0
   */
  favorCgroupMigrations?: boolean;
}

/** Everything a backend needs from a prepared host, resolved to absolute paths. */
export interface HostPaths {
  dataDir: string;
  bwrap: string;
  launcher: string;
  /** Host directory bound read-only at /.capsule in every sandbox: the agent and drivers. */
  toolsDir: string;
  seccompBpf: string;
  etcDir: string;
  etcEntries: string[];
  /** The complete /etc of a namespace sandbox (allowlisted copies + synthetic files), one bind. */
  sandboxEtcDir: string;
}

export const DEFAULT_DATA_DIR = '/var/lib/capsule';
/**
 * The prepared host: checks the platform, compiles nothing (the build does), writes the seccomp
 * program and the synthetic /etc files once, and mounts the workspace volume. Idempotent.
 */
export class HostEnvironment {
  readonly dataDir: string;
  readonly nativeDir: string;
  readonly volume: WorkspaceVolume;
  /** The uid ranges of sandboxes from templates, shared by every backend on this host. */
  readonly uidRanges = new UidRanges();
  /**
   * Prefix of this instance's cgroup names: `capsule-<6 hex of the data dir>-`. Two Capsule
   * instances on one host (or two test runs) never reconcile away each other's sandboxes.
   */
  readonly cgroupPrefix: string;
  private preparing: Promise<HostPaths> | undefined;
  private readonly tuneMigrations: boolean;
  private migrations: CgroupMigrations | undefined;

  constructor(options: HostEnvironmentOptions = {}) {
    this.dataDir = options.dataDir ?? DEFAULT_DATA_DIR;
    this.nativeDir = options.nativeDir ?? join(packageRoot(), 'dist', 'native');
    // CAPSULE_CGROUP_FAVORDYNMODS=0 keeps every command (serve, run, template) off the mount.
    this.tuneMigrations = options.favorCgroupMigrations ?? process.env.CAPSULE_CGROUP_FAVORDYNMODS !== '0';
    this.volume = new WorkspaceVolume({ dataDir: this.dataDir, sizeBytes: options.volumeBytes, quotaTool: join(this.nativeDir, 'capsule-quota') });
    this.cgroupPrefix = `${CGROUP_PREFIX}${createHash('sha256').update(resolve(this.dataDir)).digest('hex').slice(0, 6)}-`;
  }

  /** Prepares the host once per instance; concurrent callers share the same preparation. */
  ensure(): Promise<HostPaths> {
    this.preparing ??= this.prepare().catch((error: unknown) => {
      this.preparing = undefined;
      throw error;
    });
    return this.preparing;
  }

  /** How processes join cgroups on this host, once it is prepared (undefined before). */
  cgroupMigrations(): CgroupMigrations | undefined {
    return this.migrations;
  }

  private async prepare(): Promise<HostPaths> {
    checkPlatform();
    const bwrap = '/usr/bin/bwrap';
    requireFile(bwrap, 'bubblewrap is not installed');
    requireFile('/sys/fs/cgroup/memory/memory.limit_in_bytes', 'the cgroup v1 memory hierarchy is missing');
    requireFile('/sys/fs/cgroup/unified/cgroup.procs', 'the cgroup2 mount at /sys/fs/cgroup/unified is missing');
    for (const tool of ['capsule-launch', 'capsule-spawn', 'capsule-agent', 'seccomp-gen']) requireFile(join(this.nativeDir, tool), `${tool} is not built (run npm run build)`);

    // Root's alone (finding: capsule.db was 0644). A sandbox's uid never reaches anything here by
    // path: capsule-launch opens its workspace, the tools and the prepared /etc as root (fds).
    await mkdir(this.dataDir, { recursive: true, mode: DATA_DIR_MODE });
    await privatizeDataDir(this.dataDir);
    const seccompBpf = join(this.dataDir, 'seccomp.bpf');
    const etcDir = join(this.dataDir, 'etc');
    const binDir = join(this.dataDir, 'bin');
    // Steps that do not depend on each other run together: a one-shot `capsule run` prepares the
    // host on every run, and each asynchronous file-system call waits for the thread pool in turn.
    const etcEntries = presentEtcEntries();
    await Promise.all([
      this.installTools(binDir),
      this.writeSeccomp(seccompBpf),
      writeEtc(etcDir),
      (async () => {
        await this.volume.ensure();
        await chmod(this.volume.mountPoint, 0o700);
      })(),
      // Empty on the host; each sandbox launcher mounts its private staging tmpfs there.
      mkdir(STAGE_DIR, { recursive: true, mode: 0o755 }),
      (async () => {
        this.migrations = this.tuneMigrations
          ? await favorCgroupMigrations()
          : { mode: 'default', reason: 'left as the host has it (favorCgroupMigrations: false, or CAPSULE_CGROUP_FAVORDYNMODS=0)' };
      })(),
    ]);
    const sandboxEtcDir = await prepareSandboxEtc(this.dataDir, etcDir, etcEntries);
    return {
      dataDir: this.dataDir,
      bwrap,
      launcher: join(this.nativeDir, 'capsule-launch'),
      toolsDir: binDir,
      seccompBpf,
      etcDir,
      etcEntries,
      sandboxEtcDir,
    };
  }

  /** The agent and the in-sandbox scripts (interpreter drivers, native/sandbox-tools/), bound at /.capsule. */
  private async installTools(binDir: string): Promise<void> {
    // The sandbox's uid reads them there, so the directory keeps read bits for others.
    await mkdir(binDir, { recursive: true, mode: 0o755 });
    const toolsSource = join(packageRoot(), 'native', 'sandbox-tools');
    const scripts = (await readdir(toolsSource, { withFileTypes: true }).catch(() => [])).filter((entry) => entry.isFile());
    await Promise.all([
      copyIfNewer(join(this.nativeDir, 'capsule-agent'), join(binDir, 'capsule-agent'), 0o755),
      ...scripts.map((entry) => copyIfNewer(join(toolsSource, entry.name), join(binDir, entry.name), 0o644)),
    ]);
  }

  private async writeSeccomp(target: string): Promise<void> {
    const generator = join(this.nativeDir, 'seccomp-gen');
    if (isNewer(target, generator)) return;
    const temp = `${target}.${process.pid}-${randomBytes(4).toString('hex')}.tmp`;
    const fd = openSync(temp, 'w', 0o600);
    try {
      const result = spawnSync(generator, [], { stdio: ['ignore', fd, 'pipe'] });
      if (result.status !== 0) {
        throw new SandboxError('HOST_NOT_READY', `seccomp-gen failed: ${result.stderr.toString().trim()}`);
      }
    } finally {
      closeSync(fd);
    }
    await rename(temp, target);
  }
}

function checkPlatform(): void {
  if (process.platform !== 'linux') {
    throw new SandboxError('HOST_NOT_READY', `Capsule's namespace backend needs Linux; this is ${process.platform}`, {
      hint: 'Run Capsule on a Linux host (Debian 12 is what it is tested on).',
    });
  }
  if (process.getuid?.() !== 0) {
    throw new SandboxError('HOST_NOT_READY', 'Capsule needs root to set up cgroups, mounts and namespaces', {
      hint: 'Run as root; sandboxed programs themselves run as an unprivileged host uid.',
    });
  }
}

// The checks a prepared host repeats on every `capsule run` are synchronous: each is a
// microsecond syscall on a local file, and a dozen thread-pool round trips in a row cost
// milliseconds of a one-shot run.
function requireFile(path: string, problem: string): void {
  try {
    accessSync(path, constants.R_OK);
  } catch {
    throw new SandboxError('HOST_NOT_READY', `${problem} (${path} not found)`, {
      details: { path },
      hint: 'Run scripts/setup.sh once on this machine (installs bubblewrap, libseccomp, btrfs-progs and builds the helpers).',
    });
  }
}


/** The entries of ETC_ALLOWLIST this host has, in the list's order. */
function presentEtcEntries(): string[] {
  return ETC_ALLOWLIST.filter((entry) => existsSync(`/etc/${entry}`));
}

function isNewer(target: string, source: string): boolean {
  try {
    return statSync(target).mtimeMs >= statSync(source).mtimeMs;
  } catch {
    return false;
  }
}

async function copyIfNewer(source: string, target: string, mode: number): Promise<void> {
  if (isNewer(target, source)) return;
  // Another Capsule process may copy the same file at the same moment: each uses its own temp.
  const temp = `${target}.${process.pid}-${randomBytes(4).toString('hex')}.tmp`;
  await copyFile(source, temp);
  await chmod(temp, mode);
  await rename(temp, target);
}

/** Synthetic /etc files: the sandbox sees its own user, no host accounts and no resolver. */
async function writeEtc(etcDir: string): Promise<void> {
  await mkdir(etcDir, { recursive: true, mode: 0o700 });
  const files: Record<string, string> = {
    passwd: `root:x:0:0:root:/root:/usr/sbin/nologin\n${SANDBOX_USER}:x:${SANDBOX_UID}:${SANDBOX_UID}:sandbox user:/home/${SANDBOX_USER}:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n`,
    group: `root:x:0:\n${SANDBOX_USER}:x:${SANDBOX_UID}:\nnogroup:x:65534:\n`,
    hosts: '127.0.0.1 localhost sandbox\n::1 localhost ip6-localhost ip6-loopback\n',
    'resolv.conf': '# Capsule: no resolver; names are resolved by the egress proxy when the policy allows.\n',
    hostname: 'sandbox\n',
  };
  const present = new Set(readdirSync(etcDir));
  for (const [name, content] of Object.entries(files)) {
    if (present.has(name)) continue;
    await writeFile(join(etcDir, name), content, { mode: 0o600 });
  }
}

import { mkdir, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { AgentProcessRecord } from '../agent/index.js';

/** What a paused gVisor sandbox needs to be resumed, possibly by a new Capsule process. */
export interface PauseState {
  /** True when `image/` holds a checkpoint of memory and processes; false: files only. */
  keepsMemory: boolean;
  /** The agent client's next process id: a restored agent still tracks the ids before it. */
  nextProcessId: number;
  /** Processes running at the checkpoint, so a new Capsule process can reattach to them. */
  processes: AgentProcessRecord[];
  pausedAt: string;
}

/**
 * Where a Capsule instance keeps gVisor state, all under its data directory:
 *
 *   runsc/                 runsc --root: container state of this instance only
 *   gvisor/bundles/<id>/   config.json (the OCI spec), rootfs/ (mount points), mnt/<i> and
 *                          vol/<i> (where the launcher attaches host mounts and volumes)
 *   checkpoints/<id>/      pause.json and image/ (runsc checkpoint --image-path)
 *
 * A new process restores a paused sandbox from bundles/<id> and checkpoints/<id> alone. A full
 * snapshot's checkpoint is a directory of the same shape elsewhere (state.json and image/, see
 * `writeCheckpointState`), which any number of new sandboxes restore from.
 */
export class GvisorLayout {
  readonly runscRoot: string;
  private readonly bundlesDir: string;
  private readonly checkpointsDir: string;

  constructor(dataDir: string) {
    this.runscRoot = join(dataDir, 'runsc');
    this.bundlesDir = join(dataDir, 'gvisor', 'bundles');
    this.checkpointsDir = join(dataDir, 'checkpoints');
  }

  bundleDir(id: string): string {
    return join(this.bundlesDir, id);
  }

  /**
   * Where capsule-launch attaches spec mount `index` in runsc's private mount namespace, for the
   * gofer to bind: on the host it stays an empty directory or file under the 0700 bundle.
   */
  mountSource(id: string, index: number): string {
    return join(this.bundleDir(id), 'mnt', String(index));
  }

  /** Where capsule-launch attaches `spec.volumes[index]` for the gofer (host template only). */
  volumeSource(id: string, index: number): string {
    return join(this.bundleDir(id), 'vol', String(index));
  }

  checkpointDir(id: string): string {
    return join(this.checkpointsDir, id);
  }

  imageDir(id: string): string {
    return join(this.checkpointDir(id), 'image');
  }

  async writePauseState(id: string, state: PauseState): Promise<void> {
    await mkdir(this.checkpointDir(id), { recursive: true, mode: 0o700 });
    const file = join(this.checkpointDir(id), 'pause.json');
    await writeFile(`${file}.tmp`, JSON.stringify(state), { mode: 0o600 });
    await rename(`${file}.tmp`, file);
  }

  async readPauseState(id: string): Promise<PauseState | undefined> {
    const text = await readFile(join(this.checkpointDir(id), 'pause.json'), 'utf8').catch(() => undefined);
    return text === undefined ? undefined : (JSON.parse(text) as PauseState);
  }

  listBundles(): Promise<string[]> {
    return readdir(this.bundlesDir).catch(() => [] as string[]);
  }

  listCheckpoints(): Promise<string[]> {
    return readdir(this.checkpointsDir).catch(() => [] as string[]);
  }

  removeBundle(id: string): Promise<void> {
    return rm(this.bundleDir(id), { recursive: true, force: true });
  }

  removeCheckpoint(id: string): Promise<void> {
    return rm(this.checkpointDir(id), { recursive: true, force: true });
  }
}

/** The runsc image inside a checkpoint directory (a pause's or a full snapshot's). */
export function checkpointImage(dir: string): string {
  return join(dir, 'image');
}

/** What a full snapshot's checkpoint needs besides its image: the agent's processes at that instant. */
export interface CheckpointState {
  nextProcessId: number;
  processes: AgentProcessRecord[];
  takenAt: string;
}

export async function writeCheckpointState(dir: string, state: CheckpointState): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const file = join(dir, 'state.json');
  await writeFile(`${file}.tmp`, JSON.stringify(state), { mode: 0o600 });
  await rename(`${file}.tmp`, file);
}

export async function readCheckpointState(dir: string): Promise<CheckpointState | undefined> {
  const text = await readFile(join(dir, 'state.json'), 'utf8').catch(() => undefined);
  return text === undefined ? undefined : (JSON.parse(text) as CheckpointState);
}

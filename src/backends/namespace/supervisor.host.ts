/**
 * The host side of `capsule-launch --supervise` (native/launch-supervise.c): the per-sandbox
 * daemon that holds a sandbox and its agent while no Capsule server does. Its files live in
 * `<dataDir>/run` (0700): `<id>.sock` (0600, the server is its one client), `<id>.pid`,
 * `<id>.spool` (frames kept while no server listened), `<id>.log` (the launcher's, bwrap's and the
 * agent's stderr) and `<id>.sock.exit` (how the sandbox ended when no server saw it).
 */
import { mkdirSync } from 'node:fs';
import { readdir, readFile, rm } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { dirname, join } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import { spawnerAt, type SpawnedChild } from '../../host/spawner.host.js';

const READY_TIMEOUT_MS = 10_000;
const CONNECT_TIMEOUT_MS = 2_000;
const GONE_TIMEOUT_MS = 5_000;
const LOG_TAIL_BYTES = 4096;
/** Unix socket paths are at most 107 bytes. */
const MAX_SOCKET_PATH = 107;

export interface SupervisorFiles {
  dir: string;
  socket: string;
  pid: string;
  spool: string;
  log: string;
  exit: string;
}

export function runDir(dataDir: string): string {
  return join(dataDir, 'run');
}

export function supervisorFiles(dataDir: string, id: string): SupervisorFiles {
  const dir = runDir(dataDir);
  const socket = join(dir, `${id}.sock`);
  return { dir, socket, pid: join(dir, `${id}.pid`), spool: join(dir, `${id}.spool`), log: join(dir, `${id}.log`), exit: `${socket}.exit` };
}

/**
 * Starts the supervisor with `launchArgs` (everything after `--supervise ...`); resolves once it
 * listens. capsule-spawn, beside the launcher, forks it (src/host/spawner.host.ts), not this
 * process.
 */
export async function spawnSupervisor(launcher: string, launchArgs: readonly string[], files: SupervisorFiles): Promise<SpawnedChild> {
  if (Buffer.byteLength(files.socket) > MAX_SOCKET_PATH) {
    throw new SandboxError('HOST_NOT_READY', `the supervisor socket path ${files.socket} is longer than ${MAX_SOCKET_PATH} bytes`, {
      hint: 'Use a shorter data directory path (capsule serve --data-dir).',
    });
  }
  mkdirSync(files.dir, { recursive: true, mode: 0o700 });
  const child = await spawnerAt(join(dirname(launcher), 'capsule-spawn')).spawn(
    launcher,
    ['--supervise', files.socket, '--spool', files.spool, '--pidfile', files.pid, ...launchArgs],
    files.log,
  );
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      child.ready.catch((error: unknown) => {
        throw error instanceof SandboxError && error.code === 'SANDBOX_CRASHED' ? new SandboxError('SANDBOX_CRASHED', 'the sandbox supervisor exited before it listened') : error;
      }),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new SandboxError('TIMEOUT', `the sandbox supervisor did not start within ${READY_TIMEOUT_MS} ms`)), READY_TIMEOUT_MS);
      }),
    ]);
  } catch (error) {
    child.kill('SIGKILL');
    throw error;
  } finally {
    clearTimeout(timer);
  }
  return child;
}

/** Connects to a supervisor's socket; rejects when nobody listens there. */
export function connectSupervisor(files: SupervisorFiles): Promise<Socket> {
  return new Promise<Socket>((resolve, reject) => {
    const socket = connect({ path: files.socket });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new SandboxError('TIMEOUT', `the sandbox supervisor at ${files.socket} did not answer within ${CONNECT_TIMEOUT_MS} ms`));
    }, CONNECT_TIMEOUT_MS);
    socket.once('connect', () => {
      clearTimeout(timer);
      resolve(socket);
    });
    socket.once('error', (error) => {
      clearTimeout(timer);
      reject(error);
    });
  });
}

/** The end of the supervisor's log: why a sandbox did not start, or what its agent said last. */
export async function logTail(files: SupervisorFiles): Promise<string> {
  const text = await readFile(files.log, 'utf8').catch(() => '');
  return text.slice(-LOG_TAIL_BYTES).trim();
}

/** The supervisor's pid from its pidfile, when that process is still a capsule-launch. */
export async function supervisorPid(files: SupervisorFiles): Promise<number | undefined> {
  const pid = Number((await readFile(files.pid, 'utf8').catch(() => '')).trim());
  if (!Number.isInteger(pid) || pid <= 1) return undefined;
  const comm = await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '');
  return comm.trim() === 'capsule-launch' ? pid : undefined;
}

/** How a sandbox ended while no server listened (`<id>.sock.exit`), as the launcher's status. */
export async function endedStatus(files: SupervisorFiles): Promise<number | undefined> {
  const text = await readFile(files.exit, 'utf8').catch(() => undefined);
  return text === undefined ? undefined : Number(text.trim());
}

/** Waits until `pid` is gone (polling /proc, bounded); then SIGKILLs it if it is still there. */
export async function waitGone(pid: number): Promise<void> {
  const deadline = Date.now() + GONE_TIMEOUT_MS;
  while (Date.now() < deadline) {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
    // Gone, or a zombie whose parent (init) reaps it.
    if (stat === '' || /^\d+ \(.*\) Z /s.test(stat)) return;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // gone meanwhile
  }
}

/** What is left of a sandbox's supervisor at start-up. */
export type SupervisorState =
  /** No files: the sandbox never had one (a server without supervision started it). */
  | { state: 'none' }
  | { state: 'alive'; pid: number }
  /** It had one and it is gone: why the sandbox ended, in words for its end reason. */
  | { state: 'ended'; reason: string };

/**
 * Whether sandbox `id` had a supervisor, and if so whether it still runs. `what` names the
 * launcher's target in the reason (`agent exited 137`, `runsc exited 128`).
 */
export async function supervisorState(dataDir: string, id: string, what = 'agent'): Promise<SupervisorState> {
  const files = supervisorFiles(dataDir, id);
  const pid = await supervisorPid(files);
  if (pid !== undefined) return { state: 'alive', pid };
  const status = await endedStatus(files);
  if (status !== undefined) return { state: 'ended', reason: `${what} exited ${status} while no server was attached` };
  const names = await readdir(files.dir).catch(() => [] as string[]);
  if (!names.some((name) => name.split('.')[0] === id)) return { state: 'none' };
  return { state: 'ended', reason: 'supervisor gone while no server was attached' };
}

/** Ids with supervisor files in `<dataDir>/run`. */
export async function listSupervised(dataDir: string): Promise<string[]> {
  const names = await readdir(runDir(dataDir)).catch(() => [] as string[]);
  return [...new Set(names.map((name) => name.split('.')[0] ?? '').filter((id) => id !== ''))];
}

/** Ends a supervisor nobody reattached to (by its pidfile's pid) and removes its files. */
export async function removeSupervisor(dataDir: string, id: string): Promise<void> {
  const files = supervisorFiles(dataDir, id);
  const pid = await supervisorPid(files);
  if (pid !== undefined) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone meanwhile
    }
    await waitGone(pid);
  }
  await Promise.all([files.socket, files.pid, files.spool, files.log, files.exit].map((file) => rm(file, { force: true })));
}

/**
 * Why a reattach could not talk to sandbox `id`'s supervisor: SANDBOX_CRASHED with the reason
 * when it is gone now (the sandbox ended), else HOST_NOT_READY (alive but not answering, e.g. on a
 * loaded host): that is the host's failure, and the engine recovers the sandbox on its files.
 */
export async function unansweredSupervisor(dataDir: string, id: string, what = 'agent'): Promise<SandboxError> {
  const held = await supervisorState(dataDir, id, what);
  if (held.state === 'ended') return new SandboxError('SANDBOX_CRASHED', held.reason, { details: { sandboxId: id } });
  return new SandboxError('HOST_NOT_READY', 'its supervisor did not answer the restarted server', { details: { sandboxId: id } });
}

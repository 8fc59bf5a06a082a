/**
 * What holds a namespace sandbox's agent on the host: the launcher as this server's child with
 * the agent on its pipes (the sandbox dies with the server), or a supervisor daemon with the agent
 * behind a unix socket (the sandbox outlives the server; a new server reattaches).
 */
import { spawn } from 'node:child_process';
import { rm } from 'node:fs/promises';
import { AgentClient, type AgentClientOptions } from '../agent/index.js';
import { connectSupervisor, endedStatus, logTail, spawnSupervisor, supervisorFiles, supervisorPid, waitGone, type SupervisorFiles } from './supervisor.host.js';

const STDERR_TAIL_BYTES = 4096;

export interface AgentHolder {
  readonly agent: AgentClient;
  /** Resolves once the launcher (or supervisor) process is gone and its files are removed. */
  readonly gone: Promise<void>;
  /** SIGKILLs the launcher (or supervisor); the sandbox's bwrap dies with it. */
  kill(): void;
  /** The stderr of the launcher, bwrap and the agent, last part. */
  stderrTail(): Promise<string>;
  /** Why the sandbox stopped on its own, in words for its end reason. */
  lostReason(): Promise<string>;
  /** Lets go of a supervised sandbox that keeps running; false when the holder cannot (pipes). */
  detach(): boolean;
}

/** The launcher as a child with the agent on its stdio: everything dies with this process. */
export function pipedHolder(launcher: string, launchArgs: readonly string[]): AgentHolder & { spawnError: Promise<never> } {
  const child = spawn(launcher, launchArgs, { stdio: ['pipe', 'pipe', 'pipe'], env: {} });
  const agent = new AgentClient(child.stdin, child.stdout);
  let tail = '';
  child.stderr.on('data', (chunk: Buffer) => {
    tail = (tail + chunk.toString('utf8')).slice(-STDERR_TAIL_BYTES);
  });
  const gone = new Promise<void>((resolve) => child.once('close', () => resolve()));
  return {
    agent,
    gone,
    spawnError: new Promise<never>((_, reject) => child.once('error', reject)),
    kill: () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    },
    stderrTail: () => Promise.resolve(tail.trim()),
    lostReason: () => Promise.resolve(child.exitCode !== null ? `agent exited ${child.exitCode}` : 'the agent stopped'),
    detach: () => false,
  };
}

/**
 * A new supervisor for sandbox `id`; resolves once it listens and this server is its client.
 * `what` names the launcher's target in a lost reason (`agent exited 137`, `runsc exited 128`).
 */
export async function supervisedHolder(
  launcher: string,
  launchArgs: readonly string[],
  dataDir: string,
  id: string,
  what = 'agent',
  clientOptions: AgentClientOptions = {},
): Promise<AgentHolder> {
  const files = supervisorFiles(dataDir, id);
  const child = await spawnSupervisor(launcher, launchArgs, files);
  const pid = child.pid;
  // Nothing holds this process alive for the daemon (a server may stop and leave it); one that
  // is waited for does, until it is gone, or a stop could end with the wait unsettled. When the
  // starter went away first, /proc says when it is gone.
  const exited = async (): Promise<void> => {
    if ((await child.exited()) === undefined) await waitGone(pid);
  };
  try {
    const socket = await connectSupervisor(files);
    return socketHolder(new AgentClient(socket, socket, { supervised: true, ...clientOptions }), socket, files, pid, exited, what);
  } catch (error) {
    child.kill('SIGKILL');
    await exited();
    await removeFiles(files);
    throw error;
  }
}

/**
 * Takes over sandbox `id` from the supervisor an earlier server started; undefined when none
 * answers (its files are left for the caller's clean-up).
 */
export async function reattachHolder(dataDir: string, id: string, what = 'agent'): Promise<AgentHolder | undefined> {
  const files = supervisorFiles(dataDir, id);
  const pid = await supervisorPid(files);
  if (pid === undefined) return undefined;
  const socket = await connectSupervisor(files).catch(() => undefined);
  if (socket === undefined) return undefined;
  const agent = new AgentClient(socket, socket, { reattach: true });
  const holder = socketHolder(agent, socket, files, pid, undefined, what);
  try {
    await agent.ready;
  } catch {
    socket.destroy();
    return undefined;
  }
  return holder;
}

function socketHolder(
  agent: AgentClient,
  socket: import('node:net').Socket,
  files: SupervisorFiles,
  pid: number,
  exited: (() => Promise<void>) | undefined,
  what: string,
): AgentHolder {
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  let detached = false;
  let reason = 'supervisor gone';
  // Not our child after a reattach: the socket closing says the supervisor let go; /proc says it is gone.
  const gone = (async () => {
    await closed;
    if (detached) return;
    await (exited ? exited() : waitGone(pid));
    const status = await endedStatus(files);
    if (status !== undefined) reason = `${what} exited ${status}`;
    await removeFiles(files);
  })();
  return {
    agent,
    gone,
    kill: () => {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone already
      }
    },
    stderrTail: () => logTail(files),
    lostReason: async () => {
      await gone;
      return reason;
    },
    detach: () => {
      detached = true;
      agent.detach();
      return true;
    },
  };
}

async function removeFiles(files: SupervisorFiles): Promise<void> {
  await Promise.all([files.socket, files.pid, files.spool, files.log, files.exit].map((file) => rm(file, { force: true })));
}

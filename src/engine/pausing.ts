import { SandboxError } from '../errors/index.js';
import type { BackendSandbox, PauseResult } from '../backends/backend.js';
import type { LiveSandbox } from './sandbox-table.js';

/**
 * Pauses a running sandbox: `keepMemory` keeps processes and their memory (gVisor: a checkpoint
 * on disk that survives a restart; namespace: a frozen cgroup in RAM, which survives one when a
 * supervisor holds it); without it the processes end and the files stay. The record says what
 * was kept.
 */
export async function pauseSandbox(entry: LiveSandbox & { sandbox: BackendSandbox }, keepMemory: boolean, nowMs: number): Promise<void> {
  const sandbox = entry.sandbox;
  let result: PauseResult;
  if (sandbox.pause) result = await sandbox.pause({ keepMemory });
  else if (keepMemory) {
    await sandbox.freeze();
    result = { keepsMemory: true, survivesRestart: false };
  } else {
    throw new SandboxError('BACKEND_CANNOT_ENFORCE', `backend ${entry.info.backend} cannot pause without memory`, {
      hint: 'Pause with keepMemory: true.',
    });
  }
  entry.info.state = 'paused';
  const spec = entry.info.spec;
  entry.info.pause = {
    ...result,
    pausedAt: new Date(nowMs).toISOString(),
    ttl: spec.onTimeout === 'pause' ? 'suspended' : 'running',
    resumesOn: spec.autoResume ? 'call' : 'resume',
  };
}

/**
 * Continues a paused sandbox: restored processes (or a thawed cgroup). With `onTimeout: pause`
 * the TTL was suspended and starts again from now. Returns the processes a restore brought back.
 */
export async function resumeSandbox(entry: LiveSandbox & { sandbox: BackendSandbox }, nowMs: number): Promise<void> {
  const sandbox = entry.sandbox;
  if (sandbox.resume) await sandbox.resume();
  else await sandbox.thaw();
  for (const agent of sandbox.processes?.() ?? []) entry.processes.adopt(entry.info, agent, entry.quotaBytes);
  entry.info.state = 'running';
  delete entry.info.pause;
  if (entry.info.spec.onTimeout === 'pause') entry.info.expiresAt = new Date(nowMs + entry.info.spec.ttlMs).toISOString();
}

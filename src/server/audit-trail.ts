import { SandboxError } from '../errors/index.js';
import type { ProcessEnd } from '../engine/result.js';
import { sha256Hex, type AuditLog } from '../store/index.js';
import type { Principal } from './auth.js';
import { toSandboxError } from './errors.js';

/** What the audit log records about a call: its sandbox, its subject (hashed) and policy. */
export interface AuditSubject {
  sandboxId?: string;
  /** The argv, file path or code the call acts on; only its sha256 is stored. */
  subject?: string;
  /** Capabilities the call opens (network mode other than none, mounts, handles). */
  policy?: Record<string, unknown> | null;
}

/**
 * The audit records of one call: `attempt` before the work (if it cannot be written, the work
 * is not done) and `outcome` after it (if that cannot be written, the call reports a failure).
 */
export class AuditTrail {
  private attemptSeq: number | undefined;
  private subject: AuditSubject = {};

  constructor(
    private readonly log: AuditLog,
    private readonly operation: string,
    private readonly principal: Principal,
    private readonly requestId: string,
  ) {}

  attempt(subject: AuditSubject): void {
    this.subject = subject;
    try {
      this.attemptSeq = this.log.append({
        tenantId: this.principal.tenantId,
        keyId: this.principal.keyId,
        operation: this.operation,
        phase: 'attempt',
        requestId: this.requestId,
        sandboxId: subject.sandboxId ?? null,
        subjectSha256: subject.subject === undefined ? null : sha256Hex(subject.subject),
        policy: subject.policy ?? null,
      }).seq;
    } catch (error) {
      throw new SandboxError('INTERNAL', 'the audit log could not be written, so the call was not carried out', {
        hint: 'Retry later; if it persists, give the operator the requestId.',
        cause: error,
      });
    }
  }

  /** Whether an attempt was written that still awaits its outcome. */
  get recording(): boolean {
    return this.attemptSeq !== undefined;
  }

  /** Records success; `finalEvent` is a stream's last event (an exit names the limit it hit). */
  succeeded(sandboxId?: string, finalEvent?: { type: string }): void {
    this.outcome(outcomeOfEvent(finalEvent), sandboxId);
  }

  /** Records a failure. The call fails anyway, so a failed write only adds to the log. */
  failed(error: unknown): void {
    try {
      this.outcome(toSandboxError(error).code);
    } catch {
      // The original error is what the caller sees; the write failure is in the server log
      // through the INTERNAL error raised for the next audited call.
    }
  }

  private outcome(outcome: string, sandboxId?: string): void {
    if (this.attemptSeq === undefined) return;
    const attemptSeq = this.attemptSeq;
    this.attemptSeq = undefined;
    try {
      this.log.append({
        tenantId: this.principal.tenantId,
        keyId: this.principal.keyId,
        operation: this.operation,
        phase: 'outcome',
        attemptSeq,
        requestId: this.requestId,
        sandboxId: this.subject.sandboxId ?? sandboxId ?? null,
        outcome,
      });
    } catch (error) {
      throw new SandboxError('INTERNAL', 'the audit log could not record the outcome of this call; treat its effect as unknown', {
        details: { effect: 'unknown' },
        hint: 'Check the resource before retrying; give the operator the requestId.',
        cause: error,
      });
    }
  }
}

/** `ok`, an error code, or `limit:<resource>` for a process that hit a limit. */
export function outcomeOfEvent(event: { type: string } | undefined): string {
  // A code run ends with `end`; its execution carries the limit that stopped it, if any.
  if (event?.type === 'end') {
    const limit = (event as { execution?: { limit?: { resource: string } } }).execution?.limit;
    return limit ? `limit:${limit.resource}` : 'ok';
  }
  if (event?.type === 'error') return (event as { error?: { code?: string } }).error?.code ?? 'error';
  if (event?.type !== 'exit') return 'ok';
  const result = (event as { result?: ProcessEnd }).result;
  if (result?.outcome === 'limit_exceeded' && result.limit) return `limit:${result.limit.resource}`;
  if (result?.outcome === 'error') return result.error?.code ?? 'error';
  return 'ok';
}

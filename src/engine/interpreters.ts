import type { AgentProcess } from '../backends/agent/index.js';
import type { BackendSandbox } from '../backends/backend.js';
import { InterpreterService } from './interpreter/index.js';

/**
 * The interpreter contexts of each running sandbox (src/engine/interpreter), made on first use.
 * Every surface (v1 routes, the E2B facade, MCP) shares this one service per sandbox, so they see
 * the same contexts. A sandbox's service is closed when it ends.
 */
export class Interpreters {
  private readonly services = new Map<string, InterpreterService>();

  of(sandbox: BackendSandbox): InterpreterService {
    let service = this.services.get(sandbox.id);
    if (!service) this.services.set(sandbox.id, (service = new InterpreterService(sandbox)));
    return service;
  }

  /**
   * After a reattach: the contexts whose drivers run among `processes` (an earlier server
   * started them), adopted with their state. Returns the processes that were drivers.
   */
  adopt(sandbox: BackendSandbox, processes: readonly AgentProcess[]): Set<AgentProcess> {
    return this.of(sandbox).adopt(processes);
  }

  /** Shuts a sandbox's contexts down (alongside its destroy, so a busy kernel cannot delay it). */
  async close(sandboxId: string): Promise<void> {
    const service = this.services.get(sandboxId);
    this.services.delete(sandboxId);
    await service?.close();
  }
}

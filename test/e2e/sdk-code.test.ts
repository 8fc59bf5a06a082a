import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Execution as EngineExecution, ContextInfo as EngineContextInfo } from '../../src/wire/index.js';
import type { RunningServer } from '../../src/server/bootstrap.js';
import { AbortedError, NotFoundError, Sandbox, type ConnectionOptions, type ContextInfo, type Execution } from '../../src/sdk/index.js';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { startTestServer } from './server-helpers.js';
import { runCli, type CliRun } from '../helpers/cli.js';

/** `sandbox.runCode` / `sandbox.contexts` and `capsule run-code --sandbox` against a real server. */
let server: RunningServer;
let conn: ConnectionOptions;

// The SDK restates the engine's interpreter types (its import rule): they must stay assignable.
export const executionsMatch: Execution = {} as EngineExecution;
export const contextsMatch: ContextInfo = {} as EngineContextInfo;

beforeAll(async () => {
  const started = await startTestServer();
  server = started.server;
  conn = { url: started.url, apiKey: started.apiKey };
});
afterAll(async () => {
  await server?.close();
});
afterEach(expectNoLeaks);

async function withSandbox(test: (sandbox: Sandbox) => Promise<void>): Promise<void> {
  const sandbox = await Sandbox.create({ ttlMs: 120_000, limits: { memoryBytes: 1024 * 1024 * 1024, wallClockMs: 20_000 } }, conn);
  try {
    await test(sandbox);
  } catch (error) {
    (error as Error).message = `[sandbox ${sandbox.sandboxId}] ${(error as Error).message}`;
    throw error;
  } finally {
    await sandbox.kill().catch(() => undefined);
  }
}

function capsule(...argv: string[]): Promise<CliRun> {
  return runCli(argv, { CAPSULE_URL: conn.url, CAPSULE_API_KEY: conn.apiKey });
}

describe('sandbox.runCode and sandbox.contexts', () => {
  it('keeps state, streams to callbacks, separates contexts, times out and aborts without losing state', () =>
    withSandbox(async (sandbox) => {
      await sandbox.runCode('x = 42');
      const printed: string[] = [];
      const doubled = await sandbox.runCode('print(x * 2)', { onStdout: (text) => printed.push(text) });
      expect(printed.join('')).toBe('84\n');
      expect(doubled.stdout.join('')).toBe('84\n');
      expect(doubled.executionCount).toBeGreaterThan(1);

      await sandbox.runCode('let n = 41', { language: 'js' });
      const results: string[] = [];
      await sandbox.runCode('n + 1', { language: 'js', onResult: (r) => results.push(r.text ?? '') });
      expect(results).toEqual(['42']);

      const own = await sandbox.contexts.create({ language: 'python', envVars: { MODE: 'own' } });
      expect(own).toMatchObject({ language: 'python', cwd: '/workspace' });
      const errors: string[] = [];
      const isolated = await sandbox.runCode('import os\nprint(os.environ["MODE"])\nx', { contextId: own.id, onError: (e) => errors.push(e.name) });
      expect(isolated.stdout.join('')).toBe('own\n');
      expect(errors).toEqual(['NameError']);
      expect(isolated.error).toMatchObject({ name: 'NameError', traceback: expect.stringContaining('NameError') as unknown });
      expect((await sandbox.contexts.list()).map((c) => c.id)).toContain(own.id);

      const slow = await sandbox.runCode('import time\nwhile True:\n    time.sleep(0.05)', { timeoutMs: 800 });
      expect(slow.limit).toMatchObject({ resource: 'wall_clock' });

      // Aborting the call ends the request; the server interrupts the code and the context stays.
      const controller = new AbortController();
      const aborted = sandbox.runCode('print("go", flush=True)\nwhile True:\n    time.sleep(0.05)', {
        signal: controller.signal,
        onStdout: () => controller.abort(),
      });
      await expect(aborted).rejects.toBeInstanceOf(AbortedError);
      expect((await sandbox.runCode('print(x)')).stdout.join('')).toBe('42\n');

      await sandbox.contexts.restart(own.id);
      expect((await sandbox.runCode('MODE = 1\nprint(MODE)', { contextId: own.id })).stdout.join('')).toBe('1\n');
      await sandbox.contexts.delete(own.id);
      await expect(sandbox.runCode('1', { contextId: own.id })).rejects.toBeInstanceOf(NotFoundError);
      await expect(sandbox.contexts.delete(own.id)).rejects.toMatchObject({ code: 'NOT_FOUND' });
    }));
});

describe('capsule run-code --sandbox', () => {
  it('runs in a live sandbox context through the server, with --context and --json', () =>
    withSandbox(async (sandbox) => {
      expect(await capsule('run-code', '--sandbox', sandbox.sandboxId, 'x = 5')).toMatchObject({ code: 0, stdout: '' });
      expect(await capsule('run-code', '--sandbox', sandbox.sandboxId, 'print(x + 1)')).toMatchObject({ code: 0, stdout: '6\n' });

      const js = await sandbox.contexts.create({ language: 'js' });
      expect((await capsule('run-code', '--sandbox', sandbox.sandboxId, '--context', js.id, 'var y = 20')).code).toBe(0);
      const out = await capsule('run-code', '--sandbox', sandbox.sandboxId, '--context', js.id, '--json', 'console.log("hi"); y + 1');
      expect(out.code, out.stderr).toBe(0);
      const events = out.stdout.trim().split('\n').map((line) => JSON.parse(line) as Record<string, unknown>);
      expect(events).toEqual([
        { type: 'stdout', text: 'hi\n' },
        expect.objectContaining({ type: 'result', text: '21', isMainResult: true }),
        expect.objectContaining({ type: 'end', sandboxId: sandbox.sandboxId, contextId: js.id }),
      ]);

      const raised = await capsule('run-code', '--sandbox', sandbox.sandboxId, 'raise ValueError("bad")');
      expect(raised.code).toBe(1);
      expect(raised.stderr).toContain('ValueError');
      expect((await capsule('run-code', '--sandbox', sandbox.sandboxId, '--timeout', '500ms', 'while True: pass')).code).toBe(124);
      expect((await capsule('run-code', '--context', js.id, '1')).code).toBe(2);
      expect((await capsule('run-code', '--sandbox', sandbox.sandboxId, '--context', 'py-000000000000', '1')).code).not.toBe(0);
    }));
});

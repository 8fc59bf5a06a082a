/**
 * Interpreter contexts in real sandboxes: an IPython kernel and a Node REPL running inside the
 * sandbox. Non-destructive cases share one sandbox per language (fresh contexts where state
 * matters); the memory bomb gets its own small sandbox.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NamespaceBackend } from '../../src/backends/namespace/namespace-backend.host.js';
import type { BackendSandbox } from '../../src/backends/backend.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { parseSpec, type SandboxSpecInput } from '../../src/sandbox-spec/index.js';
import { newSandboxId } from '../../src/engine/ids.js';
import { isSandboxError } from '../../src/errors/index.js';
import { InterpreterService } from '../../src/engine/interpreter/index.js';
import { type Execution } from '../../src/wire/index.js';
import { runCodeCommand } from '../../src/cli/commands/run-code.js';
import type { CliContext } from '../../src/cli/context.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { PassThrough } from 'node:stream';

const MiB = 1024 * 1024;

/** One backend (and host environment, which holds the volume open) for the whole file. */
const backend = new NamespaceBackend({ host: new HostEnvironment({ dataDir: testDataDir() }) });

async function createSandbox(spec: SandboxSpecInput): Promise<BackendSandbox> {
  return backend.create(parseSpec(spec), { id: newSandboxId() });
}

/** One sandbox and its interpreters for a describe block; failures name the sandbox. */
function sharedSandbox(spec: SandboxSpecInput): { sandbox: () => BackendSandbox; interpreters: () => InterpreterService } {
  let sandbox: BackendSandbox | undefined;
  let interpreters: InterpreterService | undefined;
  beforeAll(async () => {
    sandbox = await createSandbox(spec);
    interpreters = new InterpreterService(sandbox);
  });
  afterAll(async () => {
    await interpreters?.close();
    await sandbox?.destroy();
  });
  return {
    sandbox: () => sandbox ?? expect.unreachable('no sandbox'),
    interpreters: () => interpreters ?? expect.unreachable('no interpreters'),
  };
}

function describeExecution(sandbox: BackendSandbox, execution: Execution): string {
  const { results, ...rest } = execution;
  const short = results.map((r) => ({ ...r, png: r.png?.slice(0, 40), html: r.html?.slice(0, 200) }));
  return `sandbox ${sandbox.id}: ${JSON.stringify({ ...rest, results: short }).slice(0, 3000)}`;
}

function mainText(execution: Execution): string | undefined {
  return execution.results.find((r) => r.isMainResult)?.text;
}

afterAll(expectNoLeaks);

describe('python contexts', () => {
  const shared = sharedSandbox({ limits: { memoryBytes: 1024 * MiB, pids: 256, wallClockMs: 20_000 } });
  let contextId = '';
  beforeAll(async () => {
    contextId = (await shared.interpreters().createContext({ language: 'python' })).id;
  });

  it('keeps variables between calls', async () => {
    const interpreters = shared.interpreters();
    const first = await interpreters.runCode('x = 42', { contextId });
    expect(first.error, describeExecution(shared.sandbox(), first)).toBeUndefined();
    const second = await interpreters.runCode('print(x * 2)\nx + 1', { contextId });
    expect(second.stdout.join(''), describeExecution(shared.sandbox(), second)).toBe('84\n');
    expect(mainText(second)).toBe('43');
    expect(second.executionCount).toBe(2);
  });

  it('returns a matplotlib plot as a PNG', async () => {
    const execution = await shared.interpreters().runCode(
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()',
      { contextId },
    );
    const png = execution.results.find((r) => r.png !== undefined)?.png;
    expect(png, describeExecution(shared.sandbox(), execution)).toBeDefined();
    const bytes = Buffer.from(png ?? '', 'base64');
    expect(bytes.subarray(0, 8).toString('hex')).toBe('89504e470d0a1a0a');
    expect(bytes.subarray(12, 16).toString('latin1')).toBe('IHDR');
    expect(bytes.readUInt32BE(16)).toBeGreaterThan(0);
    expect(bytes.readUInt32BE(20)).toBeGreaterThan(0);
    // A figure as the last expression is the main result, as an image too.
    const figure = await shared.interpreters().runCode('fig = plt.figure()\nplt.plot([3, 1])\nfig', { contextId });
    expect(figure.results.some((r) => r.png !== undefined), describeExecution(shared.sandbox(), figure)).toBe(true);
  });

  it('returns a pandas DataFrame as HTML', async () => {
    const execution = await shared.interpreters().runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})', { contextId });
    const main = execution.results.find((r) => r.isMainResult);
    expect(main?.html, describeExecution(shared.sandbox(), execution)).toContain('<table');
    expect(main?.text).toContain('a  b');
  });

  it('reports an exception with name, value and traceback, and keeps working', async () => {
    const interpreters = shared.interpreters();
    const failed = await interpreters.runCode('def f():\n    return 1 / 0\nf()', { contextId });
    expect(failed.error?.name, describeExecution(shared.sandbox(), failed)).toBe('ZeroDivisionError');
    expect(failed.error?.value).toBe('division by zero');
    expect(failed.error?.traceback).toContain('return 1 / 0');
    expect(failed.limit).toBeUndefined();
    const after = await interpreters.runCode('x', { contextId });
    expect(mainText(after), describeExecution(shared.sandbox(), after)).toBe('42');
  });

  it('interrupts code that runs past timeoutMs and keeps the earlier state', async () => {
    const interpreters = shared.interpreters();
    await interpreters.runCode('y = "kept"', { contextId });
    const slow = await interpreters.runCode('import time\nwhile True:\n    time.sleep(0.05)', { contextId, timeoutMs: 1000 });
    expect(slow.limit?.resource, describeExecution(shared.sandbox(), slow)).toBe('wall_clock');
    expect(slow.limit?.message).toMatch(/^wall-clock limit 1 s exceeded \(ran [\d.]+ m?s\); the code was interrupted; context py-\w+ keeps/);
    expect(slow.error?.name).toBe('KeyboardInterrupt');
    const after = await interpreters.runCode('y', { contextId });
    expect(mainText(after), describeExecution(shared.sandbox(), after)).toBe("'kept'");
  });

  it('keeps two contexts apart', async () => {
    const interpreters = shared.interpreters();
    const other = await interpreters.createContext({ language: 'python', cwd: '/tmp' });
    expect(other.cwd).toBe('/tmp');
    const missing = await interpreters.runCode('x', { contextId: other.id });
    expect(missing.error?.name, describeExecution(shared.sandbox(), missing)).toBe('NameError');
    const cwd = await interpreters.runCode('import os\nos.getcwd()', { contextId: other.id });
    expect(mainText(cwd)).toBe("'/tmp'");
    expect(interpreters.listContexts().map((c) => c.id)).toEqual(expect.arrayContaining([contextId, other.id]));
    await interpreters.deleteContext(other.id);
    await expect(interpreters.runCode('1', { contextId: other.id })).rejects.toSatisfy((e) => isSandboxError(e, 'NOT_FOUND'));
    // A deleted context leaves nothing in the sandbox's /tmp (it is memory).
    const leftovers = await interpreters.runCode(`import os\nos.path.exists("/tmp/.capsule-py-${other.id}")`, { contextId });
    expect(mainText(leftovers), describeExecution(shared.sandbox(), leftovers)).toBe('False');
  });

  it('sets per-call environment variables for that call only', async () => {
    const interpreters = shared.interpreters();
    const withEnv = await interpreters.runCode('import os\nos.environ.get("CAPSULE_TEST_VAR")', {
      contextId,
      envVars: { CAPSULE_TEST_VAR: 'only-now' },
    });
    expect(mainText(withEnv), describeExecution(shared.sandbox(), withEnv)).toBe("'only-now'");
    const later = await interpreters.runCode('os.environ.get("CAPSULE_TEST_VAR", "unset")', { contextId });
    expect(mainText(later), describeExecution(shared.sandbox(), later)).toBe("'unset'");
  });

  it('restarts a kernel that ignores the interrupt, leaving no orphan kernel behind', async () => {
    const interpreters = shared.interpreters();
    const { id } = await interpreters.createContext({ language: 'python' });
    await interpreters.runCode('lost = 1', { contextId: id });
    const stubborn = await interpreters.runCode(
      'import time\nwhile True:\n    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass',
      { contextId: id, timeoutMs: 800 },
    );
    expect(stubborn.limit?.resource, describeExecution(shared.sandbox(), stubborn)).toBe('wall_clock');
    expect(stubborn.limit?.message).toContain(`context ${id} was restarted and its state (variables, imports) is lost`);
    const after = await interpreters.runCode('"lost" in globals()', { contextId: id });
    expect(mainText(after), describeExecution(shared.sandbox(), after)).toBe('False');
    // One kernel per live Python context: the killed driver's kernel died with it (PDEATHSIG).
    const kernels = await interpreters.runCode(
      'import os\nsum(1 for p in os.listdir("/proc") if p.isdigit() and b"ipykernel_launcher" in open(f"/proc/{p}/cmdline", "rb").read())',
      { contextId: id },
    );
    expect(Number(mainText(kernels)), describeExecution(shared.sandbox(), kernels)).toBe(interpreters.listContexts().filter((c) => c.language === 'python').length);
    await interpreters.deleteContext(id);
  });

  it('creates a default python context on first use without a contextId', async () => {
    const interpreters = shared.interpreters();
    const first = await interpreters.runCode('z = 7');
    const second = await interpreters.runCode('z * 6');
    expect(mainText(second), describeExecution(shared.sandbox(), second)).toBe('42');
    expect(second.contextId).toBe(first.contextId);
    expect(second.contextId).not.toBe(contextId);
  });
});

describe('javascript and typescript contexts', () => {
  const shared = sharedSandbox({ limits: { memoryBytes: 512 * MiB, wallClockMs: 20_000 } });

  it('keeps variables, awaits at top level and returns the last value', async () => {
    const interpreters = shared.interpreters();
    const { id } = await interpreters.createContext({ language: 'js' });
    await interpreters.runCode('let x = 42', { contextId: id });
    const printed = await interpreters.runCode('console.log(x * 2)', { contextId: id });
    expect(printed.stdout.join(''), describeExecution(shared.sandbox(), printed)).toBe('84\n');
    const awaited = await interpreters.runCode('const y = await Promise.resolve(x + 1); ({ y, list: [1, 2] })', { contextId: id });
    const main = awaited.results.find((r) => r.isMainResult);
    expect(main?.json, describeExecution(shared.sandbox(), awaited)).toEqual({ y: 43, list: [1, 2] });
    expect(main?.text).toBe('{ y: 43, list: [ 1, 2 ] }');
    const modules = await interpreters.runCode('const os = await import("node:os"); [os.platform(), typeof require("node:path").join]', { contextId: id });
    expect(modules.results[0]?.json, describeExecution(shared.sandbox(), modules)).toEqual(['linux', 'function']);
  });

  it('reports errors and keeps working; contexts do not share variables', async () => {
    const interpreters = shared.interpreters();
    const a = await interpreters.createContext({ language: 'js' });
    const b = await interpreters.createContext({ language: 'js' });
    await interpreters.runCode('var secret = 1', { contextId: a.id });
    const failed = await interpreters.runCode('secret', { contextId: b.id });
    expect(failed.error?.name, describeExecution(shared.sandbox(), failed)).toBe('ReferenceError');
    expect(failed.error?.value).toBe('secret is not defined');
    const thrown = await interpreters.runCode('function f() { throw new RangeError("deep") }\nf()', { contextId: a.id });
    expect(thrown.error?.name).toBe('RangeError');
    expect(thrown.error?.traceback).toContain('at f (');
    const after = await interpreters.runCode('secret + 1', { contextId: a.id });
    expect(after.results[0]?.text, describeExecution(shared.sandbox(), after)).toBe('2');
  });

  it('runs concurrent calls on one context one after another, and caps output with a flag', async () => {
    const interpreters = shared.interpreters();
    const { id } = await interpreters.createContext({ language: 'js' });
    const [slow, fast] = await Promise.all([
      interpreters.runCode('let order = ["slow"]; await new Promise((r) => setTimeout(r, 100)); order', { contextId: id }),
      interpreters.runCode('order.push("fast"); order', { contextId: id }),
    ]);
    expect(slow.results[0]?.json, describeExecution(shared.sandbox(), slow)).toEqual(['slow']);
    expect(fast.results[0]?.json, describeExecution(shared.sandbox(), fast)).toEqual(['slow', 'fast']);
    const flood = await interpreters.runCode('console.log("x".repeat(3 * 1024 * 1024))', { contextId: id });
    expect(flood.stdoutTruncated, describeExecution(shared.sandbox(), flood)).toBe(true);
    expect(flood.stdout.join('').length).toBe(MiB);
  });

  it('interrupts sync loops and pending awaits on timeout, keeping state', async () => {
    const interpreters = shared.interpreters();
    const { id } = await interpreters.createContext({ language: 'js' });
    await interpreters.runCode('let kept = "yes"', { contextId: id });
    const loop = await interpreters.runCode('while (true) {}', { contextId: id, timeoutMs: 800 });
    expect(loop.limit?.resource, describeExecution(shared.sandbox(), loop)).toBe('wall_clock');
    expect(loop.limit?.message).toContain('keeps the state it had');
    const pending = await interpreters.runCode('await new Promise(() => {})', { contextId: id, timeoutMs: 800 });
    expect(pending.limit?.resource, describeExecution(shared.sandbox(), pending)).toBe('wall_clock');
    const after = await interpreters.runCode('kept', { contextId: id });
    expect(after.results[0]?.text, describeExecution(shared.sandbox(), after)).toBe("'yes'");
  });

  it('restarts a context whose code ignores the interrupt, and says the state is lost', async () => {
    const interpreters = shared.interpreters();
    const { id } = await interpreters.createContext({ language: 'js' });
    await interpreters.runCode('let gone = 1', { contextId: id });
    const stuck = await interpreters.runCode('await null; while (true) {}', { contextId: id, timeoutMs: 500 });
    expect(stuck.limit?.resource, describeExecution(shared.sandbox(), stuck)).toBe('wall_clock');
    expect(stuck.limit?.message).toContain('state (variables, imports) is lost');
    const after = await interpreters.runCode('typeof gone', { contextId: id });
    expect(after.results[0]?.text, describeExecution(shared.sandbox(), after)).toBe("'undefined'");
  });

  it('an abort interrupts the code and rejects with ABORTED; a restart ends a running call', async () => {
    const interpreters = shared.interpreters();
    const { id } = await interpreters.createContext({ language: 'js' });
    await interpreters.runCode('let kept = 1', { contextId: id });
    const controller = new AbortController();
    const aborted = interpreters.runCode('console.log("looping"); while (true) {}', {
      contextId: id,
      signal: controller.signal,
      onStdout: () => controller.abort(),
    });
    await expect(aborted).rejects.toSatisfy((e) => isSandboxError(e, 'ABORTED'));
    const kept = await interpreters.runCode('kept', { contextId: id });
    expect(kept.results[0]?.text, describeExecution(shared.sandbox(), kept)).toBe('1');

    let markStarted = (): void => undefined;
    const started = new Promise<void>((resolve) => (markStarted = resolve));
    const stuck = interpreters.runCode('console.log("waiting"); await new Promise(() => {})', { contextId: id, onStdout: () => markStarted() });
    await started;
    await interpreters.restartContext(id);
    const ended = await stuck;
    expect(ended.error?.name, describeExecution(shared.sandbox(), ended)).toBe('ContextRestarted');
    expect((await interpreters.runCode('typeof kept', { contextId: id })).results[0]?.text).toBe("'undefined'");
  });

  it('sets per-call environment variables for that call only', async () => {
    const interpreters = shared.interpreters();
    const first = await interpreters.runCode('process.env.CAPSULE_TEST_VAR', { language: 'js', envVars: { CAPSULE_TEST_VAR: 'only-now' } });
    expect(first.results[0]?.json, describeExecution(shared.sandbox(), first)).toBe('only-now');
    const later = await interpreters.runCode('process.env.CAPSULE_TEST_VAR ?? "unset"', { language: 'js' });
    expect(later.results[0]?.json).toBe('unset');
    expect(later.contextId).toBe(first.contextId);
    // Variables given at creation last for the context's life.
    const { id } = await interpreters.createContext({ language: 'js', envVars: { CAPSULE_CONTEXT_VAR: 'always' }, cwd: '/tmp' });
    const own = await interpreters.runCode('[process.env.CAPSULE_CONTEXT_VAR, process.cwd()]', { contextId: id });
    expect(own.results[0]?.json, describeExecution(shared.sandbox(), own)).toEqual(['always', '/tmp']);
  });

  it('runs TypeScript with its types stripped, and reports type syntax errors', async () => {
    const interpreters = shared.interpreters();
    const { id } = await interpreters.createContext({ language: 'ts' });
    const typed = await interpreters.runCode('interface P { n: number }\nconst p: P = { n: 20 };\nconst twice = (v: number): number => v * 2;\ntwice(p.n) + 2', { contextId: id });
    expect(typed.results[0]?.json, describeExecution(shared.sandbox(), typed)).toBe(42);
    const broken = await interpreters.runCode('let v: = 3', { contextId: id });
    expect(broken.error?.name, describeExecution(shared.sandbox(), broken)).toBe('SyntaxError');
    expect(broken.error?.value).toBe('Type expected.');
  });
});

describe('memory limit', () => {
  it('a memory bomb ends the context with a memory limit naming it; the sandbox stays usable', async () => {
    const sandbox = await createSandbox({ limits: { memoryBytes: 256 * MiB, wallClockMs: 30_000 } });
    const interpreters = new InterpreterService(sandbox);
    try {
      const { id } = await interpreters.createContext({ language: 'python' });
      await interpreters.runCode('before = "set"', { contextId: id });
      const bomb = await interpreters.runCode('chunks = []\nwhile True:\n    chunks.append(b"x" * (16 * 1024 * 1024))', { contextId: id });
      expect(bomb.limit?.resource, describeExecution(sandbox, bomb)).toBe('memory');
      expect(bomb.limit?.limit).toBe(256 * MiB);
      expect(bomb.limit?.message).toMatch(/^memory limit 256 MiB exceeded \(peak [\d.]+ MiB\); the OOM killer ended the python interpreter of context py-\w+/);
      expect(bomb.limit?.message).toContain(id);
      await expect(interpreters.runCode('1', { contextId: id })).rejects.toSatisfy((e) => isSandboxError(e, 'CONFLICT'));
      await interpreters.restartContext(id);
      const after = await interpreters.runCode('print(globals().get("before", "fresh")); 1 + 1', { contextId: id });
      expect(after.stdout.join(''), describeExecution(sandbox, after)).toBe('fresh\n');
      expect(mainText(after)).toBe('2');
      const kernels = await interpreters.runCode(
        'import os\nsum(1 for p in os.listdir("/proc") if p.isdigit() and b"ipykernel_launcher" in open(f"/proc/{p}/cmdline", "rb").read())',
        { contextId: id },
      );
      expect(mainText(kernels), describeExecution(sandbox, kernels)).toBe('1');

      // The same for a JavaScript context: the OOM killer ends its Node process.
      const js = await interpreters.createContext({ language: 'js' });
      const jsBomb = await interpreters.runCode('const held = []; while (true) held.push(Buffer.alloc(16 * 1024 * 1024, 1))', { contextId: js.id });
      expect(jsBomb.limit?.resource, describeExecution(sandbox, jsBomb)).toBe('memory');
      expect(jsBomb.limit?.message).toContain(`the OOM killer ended the js interpreter of context ${js.id}`);
      await interpreters.restartContext(js.id);
      const jsAfter = await interpreters.runCode('1 + 1', { contextId: js.id });
      expect(jsAfter.results[0]?.text, describeExecution(sandbox, jsAfter)).toBe('2');
      // The Python context was not touched by the other context's death.
      expect(mainText(await interpreters.runCode('1 + 2', { contextId: id }))).toBe('3');
    } finally {
      await interpreters.close();
      await sandbox.destroy();
    }
  });
});

describe('a sandbox that goes away', () => {
  it('ends a running call with SANDBOX_CRASHED', async () => {
    const sandbox = await createSandbox({});
    const interpreters = new InterpreterService(sandbox);
    try {
      const { id } = await interpreters.createContext({ language: 'js' });
      let markStarted = (): void => undefined;
      const started = new Promise<void>((resolve) => (markStarted = resolve));
      const running = interpreters.runCode('console.log("up"); await new Promise(() => {})', { contextId: id, onStdout: () => markStarted() });
      const settled = running.then(
        () => 'resolved',
        (error: unknown) => error,
      );
      await started;
      await sandbox.destroy();
      expect(isSandboxError(await settled, 'SANDBOX_CRASHED'), `sandbox ${sandbox.id}: ${String(await settled)}`).toBe(true);
    } finally {
      await interpreters.close();
      await sandbox.destroy();
    }
  });
});

describe('capsule run-code (one-shot)', () => {
  async function cli(argv: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    let out = '';
    let err = '';
    stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    stderr.on('data', (chunk: Buffer) => (err += chunk.toString()));
    // The command itself (main() would also load every other command, the server's included).
    const context: CliContext = { stdout, stderr, env: {}, exitCode: 0 };
    await runCodeCommand(context).exitOverride().parseAsync(['node', 'run-code', '--data-dir', testDataDir(), ...argv]);
    return { code: context.exitCode, stdout: out, stderr: err };
  }

  it('prints output and the result, and NDJSON events with --json', async () => {
    const plain = await cli(['print("hi")\n6 * 7']);
    expect(plain, JSON.stringify(plain)).toMatchObject({ code: 0, stdout: 'hi\n42\n' });
    const json = await cli(['--json', '--language', 'js', 'console.log("hi"); null.x']);
    const events = json.stdout.trim().split('\n').map((line) => JSON.parse(line) as { type: string; name?: string; sandboxId?: string });
    expect(events.map((e) => e.type), json.stdout + json.stderr).toEqual(['stdout', 'error', 'end']);
    expect(events[1]?.name).toBe('TypeError');
    expect(events[2]?.sandboxId).toMatch(/^[a-z2-7]{20}$/);
    expect(json.code).toBe(1);
  });

  it('exits 124 when the code runs past --timeout', async () => {
    const slow = await cli(['--timeout', '1s', '--language', 'js', 'while (true) {}']);
    expect(slow.code, JSON.stringify(slow)).toBe(124);
    expect(slow.stderr).toMatch(/limit exceeded \(wall_clock\): wall-clock limit 1 s exceeded/);
  });
});

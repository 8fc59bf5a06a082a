/**
 * Interpreter contexts: time to the first result on a new context (create the context, run
 * `1+1`, get `2`) and the p50 of `runCode("1+1")` on a warm context, for Python (IPython kernel)
 * and JavaScript (Node REPL), all inside one live sandbox.
 *
 *   node dist/bench/interpreter.js [--n 20] [--cold 3] [--data-dir DIR] [--json]
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { NamespaceBackend } from '../src/backends/namespace/namespace-backend.host.js';
import { newSandboxId } from '../src/engine/ids.js';
import { InterpreterService } from '../src/engine/interpreter/index.js';
import { type InterpreterLanguage } from '../src/wire/index.js';
import { HostEnvironment } from '../src/host/host-env.host.js';
import { parseSpec } from '../src/sandbox-spec/index.js';
import { summarize, table, timeIt } from './stats.js';

const MAX_N = 30;

function flag(name: string, fallback: number): number {
  const index = process.argv.indexOf(name);
  const value = index >= 0 ? Number(process.argv[index + 1]) : fallback;
  return Math.max(1, Math.min(MAX_N, Number.isFinite(value) ? Math.round(value) : fallback));
}

async function expectTwo(interpreters: InterpreterService, contextId: string): Promise<void> {
  const execution = await interpreters.runCode('1+1', { contextId });
  const text = execution.results.find((r) => r.isMainResult)?.text;
  if (text !== '2') throw new Error(`1+1 gave ${JSON.stringify(execution)}`);
}

async function main(): Promise<void> {
  const n = flag('--n', 20);
  const cold = flag('--cold', 3);
  const json = process.argv.includes('--json');
  const dataDirIndex = process.argv.indexOf('--data-dir');
  const ownDataDir = dataDirIndex < 0 ? await mkdtemp(join(tmpdir(), 'capsule-bench-interp-')) : undefined;
  const dataDir = ownDataDir ?? process.argv[dataDirIndex + 1] ?? '';
  const host = new HostEnvironment({ dataDir, volumeBytes: 2 * 1024 ** 3 });
  const backend = new NamespaceBackend({ host });
  const sandbox = await backend.create(parseSpec({ limits: { memoryBytes: 1024 * 1024 * 1024, pids: 256 } }), { id: newSandboxId() });
  const interpreters = new InterpreterService(sandbox);
  const rows: Record<string, string | number>[] = [];
  try {
    for (const language of ['python', 'js'] as InterpreterLanguage[]) {
      const firstResult: number[] = [];
      for (let i = 0; i < cold; i++) {
        let id = '';
        firstResult.push(
          await timeIt(async () => {
            id = (await interpreters.createContext({ language })).id;
            await expectTwo(interpreters, id);
          }),
        );
        await interpreters.deleteContext(id);
      }
      const { id } = await interpreters.createContext({ language });
      for (let i = 0; i < 3; i++) await expectTwo(interpreters, id); // warm-up
      const warm: number[] = [];
      for (let i = 0; i < n; i++) warm.push(await timeIt(() => expectTwo(interpreters, id)));
      await interpreters.deleteContext(id);
      const coldSummary = summarize(`${language} first result (new context)`, firstResult);
      const warmSummary = summarize(`${language} runCode("1+1") warm`, warm);
      for (const s of [coldSummary, warmSummary]) rows.push({ case: s.name, n: s.n, p50Ms: s.p50Ms, p95Ms: s.p95Ms, minMs: s.minMs });
    }
  } finally {
    await interpreters.close();
    await sandbox.destroy();
    if (ownDataDir !== undefined) {
      await host.volume.unmount();
      await rm(ownDataDir, { recursive: true, force: true });
    }
  }
  if (json) process.stdout.write(`${JSON.stringify({ benchmark: 'interpreter', rows })}\n`);
  else process.stdout.write(`${table(rows)}\n`);
}

await main();

import { it } from 'vitest';
import type { BackendName } from '../../src/sandbox-spec/index.js';
import type { RunOptions, RunResult } from '../../src/engine/runner.js';
import { testRunner } from '../helpers/sandbox.js';

/** Every backend the conformance suite proves. Each must be installed where the suite runs. */
export const CONFORMANCE_BACKENDS: readonly BackendName[] = ['namespace', 'gvisor'];

export interface BackendRunner {
  backend: BackendName;
  run(argv: string[], options?: RunOptions): Promise<RunResult>;
  python(code: string, options?: RunOptions): Promise<RunResult>;
}

/** A runner whose every sandbox uses `backend` (through the spec's `backend` field). */
export function backendRunner(backend: BackendName): BackendRunner {
  const runner = testRunner();
  const run = (argv: string[], options: RunOptions = {}): Promise<RunResult> =>
    runner.run(argv, { ...options, spec: { ...options.spec, backend } });
  return { backend, run, python: (code, options) => run(['python3', '-c', code], options) };
}

/** Why a backend skips a case; a backend with no entry runs it. */
export type Skips = Partial<Record<BackendName, string>>;

/**
 * A conformance case. A backend may skip it only with a written reason, which becomes part of
 * the test's name so the skip and its reason show in every test report.
 */
export function conformanceIt(backend: BackendName, name: string, skips: Skips, fn: () => Promise<void>, timeoutMs?: number): void {
  const reason = skips[backend];
  it.skipIf(reason !== undefined)(reason === undefined ? name : `${name} [skipped on ${backend}: ${reason}]`, fn, timeoutMs);
}

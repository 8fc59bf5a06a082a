import { beforeAll, it } from 'vitest';
import type { BackendName } from '../../src/sandbox-spec/index.js';
import { Runner, type RunOptions, type RunResult } from '../../src/engine/runner.js';
import { StoredTemplates } from '../../src/engine/stored-templates.js';
import { HOST_TEMPLATE } from '../../src/sandbox-spec/index.js';
import { testDataDir } from '../helpers/sandbox.js';
import { sharedDebianTemplate, TEST_DEBIAN, testTemplates } from '../helpers/templates.js';

/** Every backend the conformance suite proves. Each must be installed where the suite runs. */
export const CONFORMANCE_BACKENDS: readonly BackendName[] = ['namespace', 'gvisor'];

/**
 * The environments each backend is proved on: the host template (the host's /usr, read-only)
 * and the run's bootstrapped Debian template (a private copy-on-write root per sandbox).
 */
export const CONFORMANCE_TEMPLATES = [HOST_TEMPLATE, TEST_DEBIAN] as const;
export type ConformanceTemplate = (typeof CONFORMANCE_TEMPLATES)[number];

export interface ConformanceTarget {
  backend: BackendName;
  template: ConformanceTemplate;
}

/** Every backend on every environment, named for describe.each's `$backend` and `$template`. */
export const CONFORMANCE_TARGETS: readonly ConformanceTarget[] = CONFORMANCE_BACKENDS.flatMap((backend) =>
  CONFORMANCE_TEMPLATES.map((template) => ({ backend, template })),
);

/**
 * Makes the shared Debian template before a file's first case (once per test run: later files
 * find it). Call at the top of a conformance file.
 */
export function needsConformanceTemplates(): void {
  beforeAll(async () => {
    await sharedDebianTemplate(testTemplates());
  }, 20 * 60_000);
}

export interface BackendRunner {
  backend: BackendName;
  template: ConformanceTemplate;
  run(argv: string[], options?: RunOptions): Promise<RunResult>;
  python(code: string, options?: RunOptions): Promise<RunResult>;
}

/** A runner whose every sandbox uses the target's backend and template (through the spec). */
export function backendRunner({ backend, template }: ConformanceTarget): BackendRunner {
  const runner = new Runner({ dataDir: testDataDir(), templates: new StoredTemplates(testTemplates()) });
  const run = (argv: string[], options: RunOptions = {}): Promise<RunResult> =>
    runner.run(argv, { ...options, spec: { ...options.spec, backend, template } });
  return { backend, template, run, python: (code, options) => run(['python3', '-c', code], options) };
}

/** Why a backend or an environment skips a case; one with no entry runs it. */
export type Skips = Partial<Record<BackendName | ConformanceTemplate, string>>;

/**
 * A conformance case. A backend or environment may skip it only with a written reason, which
 * becomes part of the test's name so the skip and its reason show in every test report.
 */
export function conformanceIt(target: ConformanceTarget, name: string, skips: Skips, fn: () => Promise<void>, timeoutMs?: number): void {
  const [what, reason] = [target.backend, target.template].map((key) => [key, skips[key]] as const).find(([, why]) => why !== undefined) ?? [];
  it.skipIf(reason !== undefined)(reason === undefined ? name : `${name} [skipped on ${what}: ${reason}]`, fn, timeoutMs);
}

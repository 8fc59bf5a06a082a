import { join } from 'node:path';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { withLock } from '../../src/host/lock.host.js';
import { PUBLIC_OWNER } from '../../src/templates/names.js';
import type { TemplateRecord } from '../../src/templates/records.js';
import { TemplateService, type TemplateServiceOptions } from '../../src/templates/template-service.js';
import type { LogEntry } from '../../src/templates/build-log.js';
import { testDataDir } from './sandbox.js';

/** The run's shared Debian template: bootstrapped once per test run (per data dir), then reused. */
export const TEST_DEBIAN = 'test-debian';

/** A template service on the test run's data directory. */
export function testTemplates(options: Omit<TemplateServiceOptions, 'host'> = {}): TemplateService {
  return new TemplateService({ host: new HostEnvironment({ dataDir: testDataDir() }), ...options });
}

export interface SharedDebian {
  template: TemplateRecord;
  /** The bootstrap's streamed log, when this call made it (empty when it was already there). */
  log: LogEntry[];
}

/**
 * The one small Debian template of this test run (the `apt` variant plus the defaults and
 * python3, which the conformance suite's cases use: about 230 MiB and 1-5 min to make). The first caller bootstraps it, under a lock so that a second file
 * waits instead of bootstrapping again; later callers find it by name.
 */
export async function sharedDebianTemplate(service: TemplateService): Promise<SharedDebian> {
  await service.ensure();
  return withLock(
    join(testDataDir(), 'test-debian.lock'),
    async () => {
      const existing = await service.store.find(PUBLIC_OWNER, TEST_DEBIAN);
      if (existing) return { template: existing, log: [] };
      const log: LogEntry[] = [];
      const template = await service.buildTemplate({ owner: PUBLIC_OWNER, name: TEST_DEBIAN, source: { kind: 'debian', packages: ['python3'] }, onLog: (entry) => log.push(entry) });
      return { template, log };
    },
    20 * 60_000,
  );
}

/** Waits for `check` (polled every 50 ms) with a generous deadline; for effects of other processes. */
export async function waitFor(check: () => boolean | Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

import { randomBytes } from 'node:crypto';
import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { isSandboxError, type SandboxError } from '../../src/errors/index.js';
import { TenantDiskQuota } from '../../src/server/disk-quota.js';
import type { RunStep, RunStepOptions, StepResult, StepRunner } from '../../src/templates/builder/step-runner.js';
import { PUBLIC_OWNER } from '../../src/templates/names.js';
import type { TemplateService } from '../../src/templates/template-service.js';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { testTemplates } from '../helpers/templates.js';

/**
 * Issues 12 and 13: the layers a tenant's builds add count against its disk quota. A build that
 * hits the quota midway fails with QUOTA_EXCEEDED and leaves nothing (no pending layer, lease,
 * temp, or layer of its own); another tenant's same build is unharmed; removing a template frees
 * its layers and the quota; a tenant runs a bounded number of builds at once. Real layers on the
 * real btrfs volume; the quota is the server's own.
 */
const MiB = 1024 * 1024;
/** Room for the first COPY (8 MiB) but not the second (12 MiB more). */
const SMALL = 16 * MiB;
const quota = new TenantDiskQuota({ defaultBytes: 64 * MiB });

/** RUN steps that wait until told, then fail: a build held mid-way on purpose. */
class HeldSteps implements StepRunner {
  private readonly waiting: (() => void)[] = [];
  started = 0;

  run(_step: RunStep, options: RunStepOptions): Promise<StepResult> {
    this.started++;
    return new Promise((resolve, reject) => {
      options.signal?.addEventListener('abort', () => reject(new Error('aborted')), { once: true });
      this.waiting.push(() => resolve({ outcome: 'ok', exitCode: 1, signal: null }));
    });
  }

  releaseAll(): void {
    for (const release of this.waiting.splice(0)) release();
  }
}

const steps = new HeldSteps();
let service: TemplateService;
let context: string;
const owners = ['quota-a', 'quota-b'];

beforeAll(async () => {
  service = testTemplates({ budget: quota, stepRunner: steps, maxConcurrentBuildsPerTenant: 1 });
  await service.ensure();
  context = await mkdtemp(join(tmpdir(), 'capsule-quota-context-'));
  await writeFile(join(context, 'a.bin'), randomBytes(8 * MiB));
  await writeFile(join(context, 'b.bin'), randomBytes(12 * MiB));
});
afterEach(expectNoLeaks);
afterAll(async () => {
  for (const owner of owners) for (const template of await service.store.list(owner, { only: true })) await service.remove(owner, template.name).catch(() => undefined);
  await rm(context, { recursive: true, force: true });
});

const TWO_COPIES = 'FROM scratch\nCOPY a.bin /a.bin\nCOPY b.bin /b.bin\n';

async function failure(promise: Promise<unknown>): Promise<SandboxError> {
  const error = await promise.then(() => undefined, (e: unknown) => e);
  if (!isSandboxError(error)) throw new Error(`expected a SandboxError, got ${String(error)}`);
  return error;
}

async function ownLayers(owner: string): Promise<string[]> {
  return (await service.layers.metas()).filter((meta) => meta.owner === owner).map((meta) => meta.key);
}

describe('template layers against the tenant disk quota', () => {
  it('fails a build that hits the quota midway with QUOTA_EXCEEDED and leaves nothing; another tenant builds the same', async () => {
    const error = await failure(service.build({ owner: 'quota-a', name: 'big', contextDir: context, dockerfileText: TWO_COPIES, quotaBytes: SMALL }));
    expect(error.code).toBe('QUOTA_EXCEEDED');
    expect(error.details).toMatchObject({ resource: 'disk', for: 'templates', limit: SMALL });
    expect((error.details as { requested: number }).requested).toBeGreaterThanOrEqual(12 * MiB);
    expect(error.hint).toMatch(/remove templates you built/);
    // Nothing of the build: no template, no layer of its own (the first COPY's went too), no
    // pending layer, lease or temp, and its quota is back to nothing.
    expect(await service.store.list('quota-a', { only: true })).toEqual([]);
    expect(await ownLayers('quota-a')).toEqual([]);
    expect(await service.layers.pending()).toEqual([]);
    expect(await readdir(join(service.layers.volume.mountPoint, 'layer-leases'))).toEqual([]);
    expect(await service.buildTemps()).toEqual([]);
    expect(quota.usageOf('quota-a').templates).toBe(0);

    // Tenant B, with room, builds the same Dockerfile: A at its quota does not hurt it.
    const built = await service.build({ owner: 'quota-b', name: 'big', contextDir: context, dockerfileText: TWO_COPIES });
    expect(built.owner).toBe('quota-b');
    expect(await ownLayers('quota-b')).toHaveLength(2);
    const used = quota.usageOf('quota-b').templates;
    expect(used).toBeGreaterThanOrEqual(20 * MiB);
    expect(used).toBeLessThan(24 * MiB);
    // Read off the store, the same figure.
    expect((await service.diskUsageByTenant()).get('quota-b')).toBe(used);

    // Removing the template takes its own layers, and the quota, with it.
    await service.remove('quota-b', 'big');
    expect(await ownLayers('quota-b')).toEqual([]);
    expect(quota.usageOf('quota-b').templates).toBe(0);
  });

  it("does not charge a tenant for the operator's public layers it builds on", async () => {
    const base = await service.build({ owner: PUBLIC_OWNER, name: 'quota-public-base', contextDir: context, dockerfileText: 'FROM scratch\nCOPY b.bin /b.bin\n' });
    try {
      expect((await service.layers.meta(base.layer))?.owner).toBeUndefined();
      const child = await service.build({ owner: 'quota-a', name: 'on-public', contextDir: context, dockerfileText: 'FROM quota-public-base\nCOPY a.bin /a.bin\n', quotaBytes: SMALL });
      const used = quota.usageOf('quota-a').templates;
      // Only its own COPY (8 MiB), not the 12 MiB of the public base.
      expect(used).toBeGreaterThanOrEqual(8 * MiB);
      expect(used).toBeLessThan(10 * MiB);
      await service.remove('quota-a', child.name);
      expect(quota.usageOf('quota-a').templates).toBe(0);
    } finally {
      await service.remove(PUBLIC_OWNER, 'quota-public-base');
      await service.prune();
    }
  });

  it('runs a bounded number of builds per tenant at once (QUOTA_EXCEEDED past it), others unaffected', async () => {
    const held = 'FROM scratch\nRUN ["/held"]\n';
    const first = service.build({ owner: 'quota-a', name: 'held', contextDir: context, dockerfileText: held });
    const failed = first.then(() => undefined, (e: unknown) => e);
    await waitUntil(() => steps.started === 1);
    const second = await failure(service.build({ owner: 'quota-a', name: 'held-2', contextDir: context, dockerfileText: held }));
    expect(second.code).toBe('QUOTA_EXCEEDED');
    expect(second.details).toMatchObject({ resource: 'builds', limit: 1, used: 1 });
    expect(second.message).toMatch(/tenant quota-a already runs 1 of its 1 concurrent template builds/);
    // Another tenant's build, and the operator's, start meanwhile.
    const other = service.build({ owner: 'quota-b', name: 'held', contextDir: context, dockerfileText: held }).then(() => undefined, (e: unknown) => e);
    const operator = service.build({ owner: PUBLIC_OWNER, name: 'quota-held', contextDir: context, dockerfileText: held }).then(() => undefined, (e: unknown) => e);
    await waitUntil(() => steps.started === 3);
    steps.releaseAll();
    for (const outcome of await Promise.all([failed, other, operator])) expect(outcome).toMatchObject({ code: 'BUILD_FAILED' });
    // The slot is free again.
    const again = service.build({ owner: 'quota-a', name: 'held', contextDir: context, dockerfileText: held }).then(() => undefined, (e: unknown) => e);
    await waitUntil(() => steps.started === 4);
    steps.releaseAll();
    expect(await again).toMatchObject({ code: 'BUILD_FAILED' });
  });
});

async function waitUntil(check: () => boolean): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('timed out waiting for the held build steps');
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

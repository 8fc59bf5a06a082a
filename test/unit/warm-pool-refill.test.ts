import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { Backend, BackendSandbox, ExecRequest } from '../../src/backends/backend.js';
import { WarmPool } from '../../src/engine/warm-pool.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';

/*
 * The pool's schedule, with the backend replaced by a recorder (the backend is not what is
 * tested here; warm-pool.test.ts runs the pool on real sandboxes): after a take the replacement
 * waits refillDelayMs, so the taker's first calls do not share the host with a launch; a
 * template's warm sandbox runs `true` once before it is offered.
 */
interface Recorder {
  backend: Backend;
  creates: number;
  execs: ExecRequest[];
  destroyed: number;
}

function recorder(options: { warmUpHangs?: boolean } = {}): Recorder {
  const record: Recorder = { creates: 0, execs: [], destroyed: 0, backend: undefined as unknown as Backend };
  const sandbox = (spec: ReturnType<typeof parseSpec>): BackendSandbox =>
    ({
      id: `sb-${record.creates}`,
      spec,
      lost: new Promise(() => undefined),
      adopt: () => Promise.resolve(),
      destroy: () => {
        record.destroyed++;
        return Promise.resolve();
      },
      exec: (request: ExecRequest) => {
        record.execs.push(request);
        const exited = options.warmUpHangs ? new Promise(() => undefined) : Promise.resolve({ exitCode: 0, signal: null, lost: false });
        return Promise.resolve({ exited, onStdout: () => undefined, onStderr: () => undefined });
      },
    }) as unknown as BackendSandbox;
  record.backend = {
    name: 'namespace',
    poolKey: () => 'key',
    create: (spec: ReturnType<typeof parseSpec>) => {
      record.creates++;
      return Promise.resolve(sandbox(spec));
    },
  } as unknown as Backend;
  return record;
}

async function settle(): Promise<void> {
  for (let i = 0; i < 10; i++) await Promise.resolve();
}

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

describe('warm pool refills', () => {
  it('fills at once, and replaces a taken sandbox only after the refill delay', async () => {
    const record = recorder();
    const spec = parseSpec({});
    const pool = new WarmPool({ backend: record.backend, spec, size: 2, refillDelayMs: 100 });
    await settle();
    expect(pool.size).toBe(2);
    expect(record.creates).toBe(2);
    const createsBefore = record.creates;
    expect(await pool.take(spec)).toBeDefined();
    expect(await pool.take(spec)).toBeDefined();
    await settle();
    expect(pool.size).toBe(0);
    // Two takes, one timer: nothing started before it fires.
    await vi.advanceTimersByTimeAsync(99);
    expect(record.creates).toBe(createsBefore);
    await vi.advanceTimersByTimeAsync(1);
    await settle();
    expect(record.creates).toBe(createsBefore + 2);
    expect(pool.size).toBe(2);
    await pool.close();
  });

  it('a closed pool starts nothing when its timer would have fired', async () => {
    const record = recorder();
    const spec = parseSpec({});
    const pool = new WarmPool({ backend: record.backend, spec, size: 1, refillDelayMs: 100 });
    await settle();
    await pool.take(spec);
    await pool.close();
    const creates = record.creates;
    await vi.advanceTimersByTimeAsync(1_000);
    expect(record.creates).toBe(creates);
  });

  it("runs `true` once in a template's warm sandbox before offering it, and nothing in the host template's", async () => {
    const fromTemplate = recorder();
    const templateSpec = parseSpec({ template: 'base' });
    const pool = new WarmPool({ backend: fromTemplate.backend, spec: templateSpec, size: 1, template: { layerDir: '/layers/base' } });
    await settle();
    expect(pool.size).toBe(1);
    expect(fromTemplate.execs).toEqual([expect.objectContaining({ argv: ['true'], cwd: '/' })]);
    await pool.close();

    const fromHost = recorder();
    const hostPool = new WarmPool({ backend: fromHost.backend, spec: parseSpec({}), size: 1 });
    await settle();
    expect(hostPool.size).toBe(1);
    expect(fromHost.execs).toEqual([]);
    await hostPool.close();
  });

  it('a warm-up that does not end discards its sandbox instead of offering it, and says why', async () => {
    const record = recorder({ warmUpHangs: true });
    const errors: unknown[] = [];
    const pool = new WarmPool({ backend: record.backend, spec: parseSpec({ template: 'base' }), size: 1, template: { layerDir: '/layers/base' }, onError: (error) => errors.push(error) });
    await settle();
    expect(pool.size).toBe(0);
    await vi.advanceTimersByTimeAsync(5_000);
    await settle();
    expect(pool.size).toBe(0);
    expect(record.destroyed).toBe(1);
    expect(String(errors[0])).toContain('did not end within 5000 ms');
    await pool.close();
  });

  it('close ends a sandbox still running its warm-up instead of waiting for it', async () => {
    const record = recorder({ warmUpHangs: true });
    const pool = new WarmPool({ backend: record.backend, spec: parseSpec({ template: 'base' }), size: 1, template: { layerDir: '/layers/base' } });
    await settle();
    let closed = false;
    void pool.close().then(() => (closed = true));
    await settle();
    expect(record.destroyed).toBe(1);
    // The hanging warm-up still holds the refill until its bound: close waits no longer than that.
    await vi.advanceTimersByTimeAsync(5_000);
    await settle();
    expect(closed).toBe(true);
  });
});

import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { newApiKey } from '../../src/store/index.js';
import { describeLeaks, findLeaks } from '../helpers/leaks.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

/**
 * Issue 11, finding 4: a tenant's output must not fill the server's memory. The server runs as a
 * child process (dist/, so `npm run build` first) so that its RSS can be read from
 * /proc/PID/status; it is read after the floods ended, every stream closed and two forced full
 * garbage collections (quiet). Kept output lives on disk: a reattach and the log endpoint still
 * return every byte.
 */
const ROOT = resolve(import.meta.dirname, '../..');
const HARNESS = join(ROOT, 'dist/test/e2e/child-server.js');
const isBuilt = existsSync(HARNESS);
const MiB = 1024 * 1024;
const FLOOD_BYTES = 64 * MiB;
const FLOODS = 4;
const LINE = '0123456789abcdef\n';

const dataDir = mkdtempSync(join(testDataDir(), 'memory-'));
const apiKey = newApiKey();
let child: ChildProcess | undefined;

afterAll(async () => {
  if (child && child.exitCode === null && child.signalCode === null) {
    child.kill('SIGTERM');
    await new Promise((resolveExit) => child?.once('exit', resolveExit));
  }
  const leaks = describeLeaks(await findLeaks(dataDir));
  // This server's data dir is its own Capsule instance: its volume is ours to remove.
  await new HostEnvironment({ dataDir }).volume.unmount().catch(() => undefined);
  rmSync(dataDir, { recursive: true, force: true });
  expect(leaks, 'host resources left behind by the child server').toBe('');
  await expectNoLeaks();
});

async function startChild(): Promise<string> {
  child = spawn(process.execPath, ['--expose-gc', HARNESS, JSON.stringify({ dataDir, warmPool: 0 })], {
    env: { ...process.env, CAPSULE_API_KEY: apiKey },
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
  });
  let stdout = '';
  let stderr = '';
  child.stderr?.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
  return new Promise<string>((resolveUrl, reject) => {
    const timer = setTimeout(() => reject(new Error(`the child server did not start in 30 s: ${stderr}`)), 30_000);
    child?.stdout?.on('data', (d: Buffer) => {
      stdout += d.toString();
      const match = /^URL: (\S+)$/m.exec(stdout);
      if (match?.[1]) {
        clearTimeout(timer);
        resolveUrl(match[1]);
      }
    });
    child?.once('exit', (code) => reject(new Error(`the child server exited with ${code}: ${stderr}`)));
  });
}

/** The child's resident set after two forced full collections, from /proc/PID/status. */
async function quietRssBytes(): Promise<number> {
  const server = child!;
  await new Promise<void>((resolveGc) => {
    const onMessage = (message: unknown): void => {
      if (!(message as { gcDone?: boolean }).gcDone) return;
      server.off('message', onMessage);
      const memory = (message as { memory: Record<string, number> }).memory;
      console.log(`child memoryUsage (MiB): ${Object.entries(memory).map(([k, v]) => `${k} ${(v / MiB).toFixed(1)}`).join(', ')}`);
      resolveGc();
    };
    server.on('message', onMessage);
    server.send('gc');
  });
  const match = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${server.pid}/status`, 'utf8'));
  if (!match?.[1]) throw new Error('no VmRSS line in /proc/PID/status');
  return Number(match[1]) * 1024;
}

/** The sha256 and length `yes 0123456789abcdef | head -c N` prints. */
function expectedFlood(bytes: number): { sha256: string; bytes: number } {
  const hash = createHash('sha256');
  const block = Buffer.from(LINE.repeat(4096));
  let left = bytes;
  while (left > 0) {
    const part = block.subarray(0, Math.min(left, block.length));
    hash.update(part);
    left -= part.length;
  }
  return { sha256: hash.digest('hex'), bytes };
}

interface Followed {
  pid: number | undefined;
  stdout: { sha256: string; bytes: number };
  last: Record<string, unknown> | undefined;
}

/** Reads an NDJSON stream line by line (nothing kept), hashing the stdout bytes of its events. */
async function follow(response: Response): Promise<Followed> {
  expect(response.status).toBe(200);
  const hash = createHash('sha256');
  let bytes = 0;
  let pid: number | undefined;
  let last: Record<string, unknown> | undefined;
  let rest = '';
  const decoder = new TextDecoder();
  const take = (line: string): void => {
    if (line === '') return;
    const event = JSON.parse(line) as Record<string, unknown>;
    if (event.type === 'start') pid = event.pid as number;
    if ((event.type === 'stdout' || event.stream === 'stdout') && typeof event.data === 'string') {
      const data = Buffer.from(event.data, 'base64');
      hash.update(data);
      bytes += data.length;
    }
    last = event;
  };
  for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
    rest += decoder.decode(chunk, { stream: true });
    let newline = rest.indexOf('\n');
    while (newline >= 0) {
      take(rest.slice(0, newline));
      rest = rest.slice(newline + 1);
      newline = rest.indexOf('\n');
    }
  }
  take(rest);
  return { pid, stdout: { sha256: hash.digest('hex'), bytes }, last };
}

/**
 * Drains a stream at full speed, keeping only its last line (the exit event of an exec): the
 * floods are read the way a quick client reads them; their bytes are checked by the replays.
 */
async function lastLine(response: Response): Promise<Record<string, unknown>> {
  expect(response.status).toBe(200);
  let tail = Buffer.alloc(0);
  for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
    const joined = Buffer.concat([tail, chunk]);
    const end = joined.lastIndexOf(10, joined.length - 2);
    tail = end >= 0 ? joined.subarray(end + 1) : joined;
  }
  return JSON.parse(tail.toString()) as Record<string, unknown>;
}

describe('server memory under output floods (issue 11, finding 4)', () => {
  it.skipIf(!isBuilt)(
    'grows by less than 64 MiB over 4 × 64 MiB of output, and still replays every byte from disk (needs npm run build)',
    async () => {
      const url = await startChild();
      const call = (method: string, path: string, body?: unknown): Promise<Response> =>
        fetch(`${url}${path}`, {
          method,
          headers: { authorization: `Bearer ${apiKey}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
          body: body === undefined ? undefined : JSON.stringify(body),
        });
      const created = await call('POST', '/v1/sandboxes', { spec: { limits: { stdoutBytes: FLOOD_BYTES, wallClockMs: 120_000 } } });
      expect(created.status).toBe(201);
      const { sandboxId } = (await created.json()) as { sandboxId: string };
      const exec = (argv: string[]) => call('POST', `/v1/sandboxes/${sandboxId}/processes`, { argv, timeoutMs: 120_000 });
      // Warm up every path the test measures, so the baseline includes the code they load.
      const warm = await follow(await exec(['sh', '-c', `yes ${LINE.trim()} | head -c ${MiB}`]));
      await follow(await call('GET', `/v1/sandboxes/${sandboxId}/processes/${warm.pid}/events`));
      await follow(await call('GET', `/v1/sandboxes/${sandboxId}/processes/${warm.pid}/log`));
      const baseline = await quietRssBytes();

      const expected = expectedFlood(FLOOD_BYTES);
      const exits = await Promise.all(
        Array.from({ length: FLOODS }, async () => lastLine(await exec(['sh', '-c', `yes ${LINE.trim()} | head -c ${FLOOD_BYTES}`]))),
      );
      for (const exit of exits) {
        // A result carries at most 1 MiB of a stream inline, and says so; the rest is on disk.
        const result = (exit as { type: string; result: Record<string, unknown> }).result;
        expect(result).toMatchObject({ outcome: 'ok', stdoutBytes: FLOOD_BYTES, stdoutTruncated: false, stdoutInlineTruncated: true });
        expect(Buffer.byteLength(result.stdout as string)).toBe(MiB);
      }
      const afterFloods = await quietRssBytes();

      const listed = (await (await call('GET', `/v1/sandboxes/${sandboxId}/processes`)).json()) as { processes: { pid: number; argv: string[] }[] };
      const floodPids = listed.processes.filter((p) => p.argv.join(' ').includes(`head -c ${FLOOD_BYTES}`)).map((p) => p.pid);
      expect(floodPids).toHaveLength(FLOODS);
      for (const pid of floodPids) {
        const replay = await follow(await call('GET', `/v1/sandboxes/${sandboxId}/processes/${pid}/events`));
        expect(replay.stdout).toEqual(expected);
        expect(replay.last?.type).toBe('exit');
        const log = await follow(await call('GET', `/v1/sandboxes/${sandboxId}/processes/${pid}/log`));
        expect(log.stdout).toEqual(expected);
      }
      const afterReads = await quietRssBytes();

      const growth = { afterFloodsMiB: (afterFloods - baseline) / MiB, afterReadsMiB: (afterReads - baseline) / MiB };
      console.log(`server RSS baseline ${(baseline / MiB).toFixed(1)} MiB; growth ${JSON.stringify(growth)}`);
      expect(afterFloods - baseline, `RSS growth after the floods: ${JSON.stringify(growth)}`).toBeLessThan(64 * MiB);
      expect(afterReads - baseline, `RSS growth after the reads: ${JSON.stringify(growth)}`).toBeLessThan(64 * MiB);
      expect((await call('DELETE', `/v1/sandboxes/${sandboxId}`)).status).toBe(200);
    },
    300_000,
  );
});

import { spawnSync } from 'node:child_process';
import { chmod, lstat, mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { SandboxInfo } from '../../src/wire/index.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { startServer, type RunningServer } from '../../src/server/bootstrap.js';
import { newApiKey } from '../../src/store/index.js';
import { describeLeaks, findLeaks } from '../helpers/leaks.js';
import { readNdjson } from './server-helpers.js';

/*
 * Finding 2 of issue 11: Capsule's state was readable by any host user (capsule.db 0644,
 * workspaces 0755, checkpoint images 0644). A real server on a data directory of its own, with
 * live sandboxes on both backends (one paused to a gVisor checkpoint), process logs, artifacts
 * and a tenant's secret in a spec's env and in a workspace: every path under the data directory
 * is tried as an unprivileged host user (uid 65534), who can neither list nor read any of it. The
 * directory starts as an older Capsule left it (0755, files 0644), so the migration at start is
 * proved too.
 */
const SECRET = 'tenant-secret-c0ffee42';
const NOBODY = ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', '--'];
/** Read by sandboxes through binds; they may keep read bits for others (the data dir closes them). */
const SANDBOX_VISIBLE = [/^bin(\/|$)/, /^sandbox-etc(\/|$)/, /^net\/resolv\.conf$/, /^volume\/ws-[^/]+\/./, /^gvisor\/bundles\/[^/]+\/rootfs(\/|$)/];

let dataDir: string;
let server: RunningServer;
let apiKey: string;

beforeAll(async () => {
  dataDir = await mkdtemp(join(tmpdir(), 'capsule-private-'));
  // What an older Capsule left: an open data dir and readable state.
  await chmod(dataDir, 0o755);
  await mkdir(join(dataDir, 'logs', 'old-sandbox'), { recursive: true, mode: 0o755 });
  await writeFile(join(dataDir, 'logs', 'old-sandbox', 'stdout.log'), `old output ${SECRET}\n`, { mode: 0o644 });
  await mkdir(join(dataDir, 'checkpoints', 'old-sandbox', 'image'), { recursive: true, mode: 0o755 });
  await writeFile(join(dataDir, 'checkpoints', 'old-sandbox', 'image', 'pages.img'), `memory ${SECRET}\n`, { mode: 0o644 });
  apiKey = newApiKey();
  server = await startServer({ dataDir, port: 0, env: { CAPSULE_API_KEY: apiKey } });
});

afterAll(async () => {
  await server?.close();
  const host = new HostEnvironment({ dataDir });
  await host.volume.unmount().catch(() => undefined);
  const leaks = describeLeaks(await findLeaks(dataDir));
  await rm(dataDir, { recursive: true, force: true });
  expect(leaks, 'host resources left behind').toBe('');
});

async function call(method: string, path: string, body?: unknown): Promise<Response> {
  return fetch(`${server.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${apiKey}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}

async function create(spec: object): Promise<SandboxInfo> {
  const response = await call('POST', '/v1/sandboxes', { spec });
  const body = (await response.json()) as SandboxInfo;
  expect(response.status, JSON.stringify(body)).toBe(201);
  return body;
}

async function exec(sandboxId: string, script: string): Promise<void> {
  const exit = (await readNdjson(await call('POST', `/v1/sandboxes/${sandboxId}/processes`, { argv: ['sh', '-c', script], timeoutMs: 20_000 }))).at(-1);
  expect(exit, JSON.stringify(exit)).toMatchObject({ type: 'exit', result: { exitCode: 0 } });
}

/** Every path under `dir`, symlinks not followed, workspaces' contents included. */
async function walk(dir: string): Promise<string[]> {
  const found: string[] = [];
  const visit = async (path: string): Promise<void> => {
    found.push(path);
    const info = await lstat(path);
    if (info.isDirectory()) for (const name of await readdir(path)) await visit(join(path, name));
  };
  await visit(dir);
  return found;
}

/** The paths (of `paths`) that uid 65534 could list or read: one probe process reads them all. */
function readableByNobody(paths: string[]): string[] {
  const probe = `
import os, sys
for path in sys.stdin.read().split("\\0"):
    if not path:
        continue
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb", buffering=0) as f:
                f.read(1)
        print(path)
    except OSError:
        pass
`;
  const result = spawnSync(NOBODY[0]!, [...NOBODY.slice(1), '/usr/bin/python3', '-c', probe], { input: paths.join('\0'), encoding: 'utf8', timeout: 60_000 });
  expect(result.status, result.stderr).toBe(0);
  return result.stdout.split('\n').filter((line) => line !== '');
}

describe('Capsule state on the host', () => {
  it('is neither listable nor readable by an unprivileged host user, with sandboxes running on both backends', async () => {
    const tenant = await create({ env: { API_TOKEN: SECRET } });
    await exec(tenant.sandboxId, `mkdir -p /workspace/output && echo ${SECRET} > /workspace/output/result.txt && echo ${SECRET}`);
    const collected = await call('POST', `/v1/sandboxes/${tenant.sandboxId}/artifacts`, {});
    expect(collected.status, await collected.clone().text()).toBe(200);
    const gvisor = await create({ backend: 'gvisor', env: { API_TOKEN: SECRET } });
    await exec(gvisor.sandboxId, `echo ${SECRET} > /workspace/secret.txt; python3 -c "x = '${SECRET}' * 1000; import time; time.sleep(600)" & sleep 0.5`);
    const paused = await call('POST', `/v1/sandboxes/${gvisor.sandboxId}/pause`, { keepMemory: true });
    expect(paused.status, await paused.clone().text()).toBe(200);

    const paths = await walk(dataDir);
    const names = paths.map((path) => relative(dataDir, path));
    // The walk saw what the finding was about: the database, a workspace, logs, artifacts, a checkpoint.
    for (const expected of [/^capsule\.db$/, /^volume\/ws-.*\/output\/result\.txt$/, /^logs\//, /^artifacts\/sha256\//, new RegExp(`^checkpoints/${gvisor.sandboxId}/image/.`)]) {
      expect(names.some((name) => expected.test(name)), String(expected)).toBe(true);
    }
    expect(readableByNobody(paths)).toEqual([]);

    // Defence in depth: nothing but what sandboxes read through binds has group or other bits.
    const open: string[] = [];
    for (const path of paths) {
      const info = await lstat(path);
      const name = relative(dataDir, path);
      if (info.isSymbolicLink() || SANDBOX_VISIBLE.some((pattern) => pattern.test(name))) continue;
      if ((info.mode & 0o077) !== 0) open.push(`${name || '.'} ${(info.mode & 0o7777).toString(8)}`);
    }
    expect(open).toEqual([]);
    // The sandboxes still work through all this: their workspaces, /etc and tools are reached by fd.
    const resumed = await call('POST', `/v1/sandboxes/${gvisor.sandboxId}/resume`);
    expect(resumed.status, await resumed.clone().text()).toBe(200);
    await exec(gvisor.sandboxId, `grep -q ${SECRET} /workspace/secret.txt && cat /etc/passwd > /dev/null`);
    await exec(tenant.sandboxId, `grep -q ${SECRET} /workspace/output/result.txt && ls /.capsule > /dev/null`);
  });
});

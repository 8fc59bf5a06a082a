import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Sandbox } from '@e2b/code-interpreter';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { newApiKey } from '../../src/store/index.js';
import { testDataDir } from '../helpers/sandbox.js';
import { waitFor } from './server-helpers.js';
import { alive, exited, freePort, isBuilt, ServedInstance } from './served.js';

/**
 * Issue 16's must-show, through the official E2B SDKs: a counting background command, a PTY and
 * a Python context survive a SIGKILL of `capsule serve` (the default: no flag) and a SIGTERM
 * restart, and keep counting; output written while no server ran is read after; the Sandbox
 * object made before the crash (its envd access token) keeps working; `commands.connect` by pid
 * reattaches to the counter's stream. Runs on dist/ (`npm run build`).
 */
const dataDir = mkdtempSync(join(testDataDir(), 'sup-e2b-'));
const host = new HostEnvironment({ dataDir });
const instance = new ServedInstance(dataDir, newApiKey());
const e2bKey = `e2b_${instance.apiKey.slice('cap_'.length)}`;

afterEach(() => instance.stopAll());
afterAll(() => instance.tearDown());

const COUNTER = 'i=0; while :; do echo "tick $i"; echo $i > /home/user/count; i=$((i+1)); sleep 0.1; done';

describe('sandboxes outlive capsule serve (E2B SDKs)', () => {
  it.skipIf(!isBuilt)('a counter, a pty and a Python context survive a SIGKILL and a SIGTERM restart (needs npm run build)', async () => {
    // The same port each time: the Sandbox object keeps the URL and the token it was given.
    const port = String(await freePort());
    const first = await instance.serve('--port', port);
    const opts = { apiKey: e2bKey, apiUrl: first.url, sandboxUrl: first.url, domain: 'capsule.invalid', requestTimeoutMs: 30_000 };
    process.env.E2B_DOMAIN = 'capsule.invalid';
    const sbx = await Sandbox.create({ ...opts, timeoutMs: 600_000 });
    const countFile = join(host.volume.path(sbx.sandboxId), 'count');
    const count = (): number => (existsSync(countFile) ? Number(readFileSync(countFile, 'utf8')) : -1);
    const countsPast = (n: number, what: string) => waitFor(() => Promise.resolve(count() > n ? true : undefined), { timeoutMs: 60_000, what });

    const counter = await sbx.commands.run(COUNTER, { background: true });
    let ptyOutput = '';
    const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (data) => void (ptyOutput += Buffer.from(data).toString()) });
    await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('answer=41\n'));
    expect((await sbx.runCode('x = 41')).error).toBeUndefined();
    await countsPast(2, 'the counter to count');
    const supervisor = instance.supervisorPid(sbx.sandboxId);

    first.child.kill('SIGKILL');
    await exited(first.child);
    // No server: it counts on; what it prints now is kept for the next server.
    const atCrash = count();
    await countsPast(atCrash + 5, 'counting while no server runs');
    const whileDown = count();

    const second = await instance.serve('--port', port);
    expect(alive(supervisor)).toBe(true);
    // The object from before the crash: same access token, same context, same pty.
    expect((await sbx.runCode('x = x + 1; x')).text).toBe('42');
    const ticks: string[] = [];
    const attached = await sbx.commands.connect(counter.pid, { onStdout: (line) => void ticks.push(line) });
    // Replayed from the start, including what it printed while no server ran, then live.
    await waitFor(() => Promise.resolve(ticks.join('').includes(`tick ${whileDown}\n`) ? true : undefined), { timeoutMs: 60_000, what: 'output written while the server was down' });
    await countsPast(count(), 'counting after the restart');
    await waitFor(() => Promise.resolve(ticks.join('').includes(`tick ${count() - 1}\n`) ? true : undefined), { timeoutMs: 60_000, what: 'live output after the restart' });
    await attached.disconnect();
    const ptyHandle = await sbx.pty.connect(pty.pid, { onData: (data) => void (ptyOutput += Buffer.from(data).toString()) });
    await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('echo "pty-$((answer+1))"\n'));
    await waitFor(() => Promise.resolve(ptyOutput.includes('pty-42') ? true : undefined), { what: `the pty answers after the crash (it showed ${JSON.stringify(ptyOutput)})` });
    await ptyHandle.disconnect();

    // A SIGTERM stop leaves it running and says so; the next start takes it over again.
    second.child.kill('SIGTERM');
    await exited(second.child);
    expect(second.child.exitCode, second.stderr()).toBe(0);
    expect(second.stderr()).toContain(`capsule: left 1 sandbox running (the next start reattaches): ${sbx.sandboxId}`);
    await countsPast(count(), 'counting after a SIGTERM stop');
    const third = await instance.serve('--port', port);
    expect((await sbx.runCode('x + 1')).text).toBe('43');
    const listed = (await sbx.commands.list()).map((p) => p.pid);
    expect(listed).toEqual(expect.arrayContaining([counter.pid, pty.pid]));
    await countsPast(count(), 'counting after the second restart');
    expect(await sbx.commands.kill(counter.pid)).toBe(true);
    await sbx.kill();
    third.child.kill('SIGTERM');
    await exited(third.child);
    expect(third.child.exitCode, third.stderr()).toBe(0);
    expect(third.stderr()).not.toContain('left');
  }, 300_000);
});

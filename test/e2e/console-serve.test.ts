import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { newApiKey } from '../../src/store/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { browserProblem, openBrowser } from './browser.js';

/**
 * Issue 17: `capsule serve` (the built CLI, as the start command runs it) prints a `Console:` URL
 * on loopback that signs the operator in once, in a real browser; the long-lived key is not in it.
 */
const problem = browserProblem();
if (problem) throw new Error(`the console test cannot run: ${problem}`);

const ROOT = resolve(import.meta.dirname, '../..');
const dataDir = mkdtempSync(join(testDataDir(), 'console-serve-'));
const apiKey = newApiKey();
let child: ChildProcessWithoutNullStreams | undefined;

function exited(c: ChildProcessWithoutNullStreams): Promise<void> {
  return c.exitCode !== null || c.signalCode !== null ? Promise.resolve() : new Promise((r) => c.once('exit', () => r()));
}

/** Starts `capsule serve` and returns what it printed once the Console line is out. */
async function serve(): Promise<{ url: string; consoleUrl: string; stdout: string }> {
  const started = spawn(process.execPath, [join(ROOT, 'bin/capsule.js'), 'serve', '--port', '0', '--data-dir', dataDir, '--log-level', 'warn', '--warm-pool', '0'], {
    env: { ...process.env, CAPSULE_API_KEY: apiKey },
  });
  child = started;
  let stdout = '';
  let stderr = '';
  started.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolveServe, reject) => {
    const timer = setTimeout(() => reject(new Error(`capsule serve printed no Console: line in 30 s: ${stdout} ${stderr}`)), 30_000);
    started.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
      const url = /^URL: (\S+)$/m.exec(stdout)?.[1];
      const consoleUrl = /^Console: (\S+)$/m.exec(stdout)?.[1];
      if (url && consoleUrl) {
        clearTimeout(timer);
        resolveServe({ url, consoleUrl, stdout });
      }
    });
    started.once('exit', (code) => reject(new Error(`capsule serve exited with ${code}: ${stderr}`)));
  });
}

afterAll(async () => {
  if (child && child.exitCode === null && child.signalCode === null) {
    child.kill('SIGTERM');
    await exited(child);
  }
  // The served data dir is its own Capsule instance: its volume is ours to remove.
  await new HostEnvironment({ dataDir }).volume.unmount().catch(() => undefined);
  rmSync(dataDir, { recursive: true, force: true });
  await expectNoLeaks();
}, 120_000);

describe('capsule serve’s Console: line', () => {
  it('is a loopback URL without the API key that signs the operator in once', async () => {
    const { url, consoleUrl, stdout } = await serve();
    const port = new URL(url).port;
    expect(consoleUrl).toMatch(new RegExp(`^http://127\\.0\\.0\\.1:${port}/ui/#login=clt_[0-9a-f]{40}$`));
    expect(consoleUrl).not.toContain(apiKey);
    expect(stdout.indexOf('Console:')).toBeGreaterThan(stdout.indexOf('API key:'));
    const browser = await openBrowser();
    try {
      await browser.page.goto(consoleUrl);
      await browser.page.locator('[data-testid="sandbox-table"][data-ready="true"]').waitFor();
      await expect(browser.page.locator('[data-testid="whoami"]').textContent()).resolves.toContain('operator');
      expect(browser.page.url()).not.toContain('login=');
      expect(browser.pageErrors).toEqual([]);
    } finally {
      await browser.close();
    }
    // Once only: the token is spent.
    const token = consoleUrl.split('#login=')[1];
    const again = await fetch(`${url}/v1/sessions/login`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ loginToken: token }) });
    expect(again.status).toBe(401);
  });
});

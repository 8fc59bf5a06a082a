import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface TestRegistry {
  /** `127.0.0.1:PORT` */
  address: string;
  pid: number;
  stop(): Promise<void>;
}

/**
 * A Debian `docker-registry` on 127.0.0.1 with a port the kernel picks (parsed from its log,
 * race-free), optionally behind htpasswd (bcrypt) basic auth. It never listens elsewhere; stop()
 * ends it by its pid and removes its data.
 */
export async function startRegistry(options: { auth?: { username: string; password: string } } = {}): Promise<TestRegistry> {
  const dir = await mkdtemp(join(tmpdir(), 'capsule-registry-'));
  const config = [
    'version: 0.1',
    'log: { level: info, accesslog: { disabled: true } }',
    `storage: { filesystem: { rootdirectory: ${join(dir, 'data')} }, delete: { enabled: true } }`,
    `http: { addr: "127.0.0.1:0", secret: ${randomBytes(16).toString('hex')} }`,
  ];
  if (options.auth) {
    const line = spawnSync('htpasswd', ['-Bbn', options.auth.username, options.auth.password], { encoding: 'utf8' });
    if (line.status !== 0) throw new Error(`htpasswd failed: ${line.stderr}`);
    await writeFile(join(dir, 'htpasswd'), line.stdout, { mode: 0o600 });
    config.push(`auth: { htpasswd: { realm: capsule-test, path: ${join(dir, 'htpasswd')} } }`);
  }
  await writeFile(join(dir, 'config.yml'), `${config.join('\n')}\n`);
  const child = spawn('docker-registry', ['serve', join(dir, 'config.yml')], { stdio: ['ignore', 'ignore', 'pipe'] });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
    await rm(dir, { recursive: true, force: true });
  };
  try {
    const address = await new Promise<string>((resolve, reject) => {
      let text = '';
      child.stderr.on('data', (chunk: Buffer) => {
        text += chunk.toString();
        const match = /listening on (127\.0\.0\.1:\d+)/.exec(text);
        if (match) resolve(match[1]!);
      });
      child.once('exit', (code) => reject(new Error(`docker-registry exited (${code}): ${text.slice(-500)}`)));
    });
    const deadline = Date.now() + 30_000;
    for (;;) {
      const status = await fetch(`http://${address}/v2/`).then((r) => r.status, () => 0);
      if (status === 200 || status === 401) break;
      if (Date.now() > deadline) throw new Error(`registry at ${address} did not answer /v2/`);
      await new Promise((r) => setTimeout(r, 50));
    }
    return { address, pid: child.pid!, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

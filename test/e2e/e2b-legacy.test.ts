import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { CommandExitError, Sandbox, SandboxNotFoundError } from 'e2b-2.45';
import { expectNoLeaks } from '../helpers/sandbox.js';
import { startE2bServer, type E2bTestServer } from './e2b-harness.js';

/**
 * The older paths, through the official `e2b` 2.45.0 SDK (pinned): `POST /sandboxes` with
 * `secure` and `allow_internet_access`, `POST /sandboxes/{id}/connect`, pause with `{memory:true}`.
 */
let server: E2bTestServer;

beforeAll(async () => {
  server = await startE2bServer();
});
afterAll(async () => {
  await server?.server.close();
});
afterEach(expectNoLeaks);

describe('e2b SDK 2.45 against Capsule', () => {
  it('creates, runs, writes and reads, pauses, connects and kills on the pre-v2 paths', async () => {
    const sbx = await Sandbox.create({ ...server.opts, timeoutMs: 60_000, metadata: { sdk: '2.45' } });
    try {
      expect((await sbx.commands.run('echo hi')).stdout).toBe('hi\n');
      await expect(sbx.commands.run('exit 4')).rejects.toBeInstanceOf(CommandExitError);
      await sbx.files.write('/home/user/a.txt', 'from 2.45');
      expect(await sbx.files.read('a.txt')).toBe('from 2.45');
      expect(await sbx.pause()).toBe(true);
      expect(await sbx.isRunning()).toBe(false);
      const again = await Sandbox.connect(sbx.sandboxId, server.opts);
      expect(await again.isRunning()).toBe(true);
      expect((await again.commands.run('cat a.txt')).stdout).toBe('from 2.45');
      // 2.45 sent allow_internet_access: true without being asked: it opens nothing, and says so.
      expect(await again.getInfo()).toMatchObject({ metadata: { sdk: '2.45' }, allowInternetAccess: false, network: { denyOut: ['0.0.0.0/0'] } });
    } finally {
      expect(await sbx.kill()).toBe(true);
    }
    expect(await sbx.kill()).toBe(false);
    await expect(Sandbox.connect(sbx.sandboxId, server.opts)).rejects.toBeInstanceOf(SandboxNotFoundError);
  });
});

import { createHash } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ConflictError, Sandbox, Snapshots, type Change, type ConnectionOptions } from '../../src/sdk/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { startTestServer } from './server-helpers.js';

/**
 * The agent's loop over /v1 and the SDK on real sandboxes: snapshot, break things, restore; fork
 * ten, change each differently, list each fork's changes, keep one, discard the rest.
 */
afterEach(expectNoLeaks);

const sha256 = (text: string) => createHash('sha256').update(text).digest('hex');

async function sh(sandbox: Sandbox, line: string): Promise<string> {
  const result = await sandbox.commands.run(['/bin/sh', '-c', line]);
  expect(result.exitCode, `${line}: ${result.stderr}`).toBe(0);
  return result.stdout;
}

async function cleanUp(conn: ConnectionOptions): Promise<void> {
  for await (const info of Sandbox.listAll({ ...conn, state: ['running', 'paused', 'starting'] })) await (await Sandbox.connect(info.sandboxId, conn)).kill();
  for (const snapshot of await Snapshots.list(conn)) await Snapshots.delete(snapshot.snapshotId, conn);
}

const summary = (changes: Change[]) => changes.map((c) => `${c.kind} ${c.type} ${c.path}`).sort();

describe('changes between a sandbox and where it came from', () => {
  it('an agent explores: snapshot, break, restore; fork 10, list each fork\'s changes, apply one, discard the rest', async () => {
    const t = await startTestServer();
    const conn = { url: t.url, apiKey: t.apiKey };
    try {
      const parent = await Sandbox.create({ ttlMs: 180_000 }, conn);
      await sh(parent, 'mkdir -p /workspace/src && printf "def f():\\n    return 1\\n" > /workspace/src/main.py && echo stale > /workspace/old.txt && echo notes > /workspace/notes.md');
      await parent.commands.run(['/bin/sh', '-c', 'while :; do date +%s%N > /tmp/heartbeat.new && mv /tmp/heartbeat.new /tmp/heartbeat; sleep 0.05; done'], { background: true });

      // Snapshot, break things, and get the files back from the snapshot.
      const good = await parent.snapshot({ name: 'green' });
      await sh(parent, 'rm -rf /workspace/src');
      const restored = await Sandbox.create({ snapshot: good.snapshotId }, conn);
      expect(await sh(restored, 'cat /workspace/src/main.py')).toBe('def f():\n    return 1\n');
      // The restored sandbox has not changed anything yet.
      expect((await restored.changes()).changes).toEqual([]);
      await restored.kill();
      await sh(parent, 'mkdir -p /workspace/src && printf "def f():\\n    return 1\\n" > /workspace/src/main.py');

      // Fork ten; each tries its own fix.
      const { snapshot, forks } = await parent.fork(10);
      const sandboxes = forks.map((entry, index) => {
        if (!('sandbox' in entry)) throw new Error(`fork ${index}: ${entry.error.message}`);
        return entry.sandbox;
      });
      await Promise.all(
        sandboxes.map((fork, i) =>
          sh(fork, `printf "def f():\\n    return ${i + 2}\\n" > /workspace/src/main.py && echo attempt-${i} > /workspace/attempt-${i}.txt && rm /workspace/old.txt && mkdir /workspace/out-${i} && ln -s ../notes.md /workspace/out-${i}/link`),
        ),
      );
      for (const [i, fork] of sandboxes.entries()) {
        const listed = await fork.changes();
        expect(listed.origin).toEqual({ snapshotId: snapshot.snapshotId });
        expect(listed.truncated).toBe(false);
        expect(summary(listed.changes)).toEqual(
          [
            `added file /workspace/attempt-${i}.txt`,
            `added dir /workspace/out-${i}`,
            `added symlink /workspace/out-${i}/link`,
            'deleted file /workspace/old.txt',
            'modified file /workspace/src/main.py',
          ].sort(),
        );
        const attempt = listed.changes.find((c) => c.path === `/workspace/attempt-${i}.txt`)!;
        expect(attempt).toMatchObject({ sizeBytes: `attempt-${i}\n`.length, sha256: sha256(`attempt-${i}\n`) });
        expect(listed.changes.find((c) => c.type === 'symlink')?.target).toBe('../notes.md');
        expect(listed.changes.find((c) => c.path === '/workspace/src/main.py')?.sha256).toBe(sha256(`def f():\n    return ${i + 2}\n`));
      }

      // Keep fork 3: its changes land in the parent.
      const applied = await parent.applyChanges(sandboxes[3]!);
      expect(summary(applied.applied)).toHaveLength(5);
      expect(await sh(parent, 'cat /workspace/src/main.py /workspace/attempt-3.txt; test -e /workspace/old.txt && echo old || echo gone; readlink /workspace/out-3/link')).toBe(
        'def f():\n    return 5\nattempt-3\ngone\n../notes.md\n',
      );
      // The parent changed main.py since the fork: fork 5, which changed it too, is refused.
      const refused = await parent.applyChanges(sandboxes[5]!).catch((error: unknown) => error);
      expect(refused).toBeInstanceOf(ConflictError);
      expect((refused as ConflictError).details).toMatchObject({ paths: expect.arrayContaining(['/workspace/src/main.py', '/workspace/old.txt']) as unknown });
      expect(await sh(parent, 'cat /workspace/src/main.py; ls /workspace')).toBe('def f():\n    return 5\nattempt-3.txt\nnotes.md\nout-3\nsrc\n');
      // The parent's own changes since the fork are what it applied.
      expect(summary((await parent.changes({ since: snapshot.snapshotId })).changes)).toEqual(summary(applied.applied));
      // The background process went on through snapshot, fork and apply, and is still beating
      // (each beat is written aside and renamed over the last, so a read never sees half of one).
      const beat = Number(await sh(parent, 'cat /tmp/heartbeat'));
      expect(beat).toBeGreaterThan(0);
      await expect.poll(async () => Number(await sh(parent, 'cat /tmp/heartbeat')), { timeout: 30_000, interval: 100 }).toBeGreaterThan(beat);

      // Discard the rest.
      for (const fork of sandboxes) await fork.kill();
      await Snapshots.delete(snapshot.snapshotId, conn);
      await Snapshots.delete(good.snapshotId, conn);
      await parent.kill();
      expect(await Snapshots.list(conn)).toEqual([]);
    } finally {
      await cleanUp(conn);
      await t.server.close();
    }
  }, 240_000);

  it('a sandbox that is not a fork of this one cannot be applied; another tenant\'s is not found', async () => {
    const t = await startTestServer();
    const conn = { url: t.url, apiKey: t.apiKey };
    const minted = await t.json<{ apiKey: string }>('POST', '/v1/keys', { body: { tenantId: 'other' } });
    const other = { url: t.url, apiKey: minted.body.apiKey };
    try {
      const a = await Sandbox.create({ ttlMs: 60_000 }, conn);
      const b = await Sandbox.create({ ttlMs: 60_000 }, conn);
      const notFork = await t.json<{ code: string }>('POST', `/v1/sandboxes/${a.sandboxId}/changes/apply`, { body: { from: b.sandboxId } });
      expect(notFork.status).toBe(400);
      expect(notFork.body.code).toBe('INVALID_ARGUMENT');
      const foreign = await Sandbox.create({ ttlMs: 60_000 }, other);
      const cross = await t.json<{ code: string }>('POST', `/v1/sandboxes/${a.sandboxId}/changes/apply`, { body: { from: foreign.sandboxId } });
      expect(cross.status).toBe(404);
      expect(cross.body.code).toBe('SANDBOX_NOT_FOUND');
      const peek = await t.json<{ code: string }>('GET', `/v1/sandboxes/${foreign.sandboxId}/changes`);
      expect(peek.status).toBe(404);
      // A fresh host-template sandbox measures against an empty workspace.
      await sh(a, 'echo x > /workspace/x');
      expect(summary((await a.changes()).changes)).toEqual(['added file /workspace/x']);
    } finally {
      await cleanUp(conn);
      await cleanUp(other);
      await t.server.close();
    }
  }, 120_000);

  it('exports the added and modified entries as a tar that tar reads', async () => {
    const t = await startTestServer();
    const conn = { url: t.url, apiKey: t.apiKey };
    const out = mkdtempSync(join(testDataDir(), 'export-'));
    try {
      const sandbox = await Sandbox.create({ ttlMs: 60_000 }, conn);
      await sh(sandbox, 'mkdir -p /workspace/d && printf "%s" "hello tar" > /workspace/d/a.txt && chmod 750 /workspace/d/a.txt && ln -s d/a.txt /workspace/link && head -c 100000 /dev/urandom > /workspace/blob');
      const response = await t.call('GET', `/v1/sandboxes/${sandbox.sandboxId}/changes/export`);
      expect(response.status).toBe(200);
      expect(response.headers.get('content-type')).toBe('application/x-tar');
      const archive = Buffer.from(await response.arrayBuffer());
      const extracted = spawnSync('tar', ['-xf', '-', '-C', out], { input: archive });
      expect(extracted.status, extracted.stderr.toString()).toBe(0);
      expect(readFileSync(join(out, 'workspace/d/a.txt'), 'utf8')).toBe('hello tar');
      expect(readlinkSync(join(out, 'workspace/link'))).toBe('d/a.txt');
      const blob = readFileSync(join(out, 'workspace/blob'));
      const listed = (await sandbox.changes()).changes.find((c) => c.path === '/workspace/blob')!;
      expect(createHash('sha256').update(blob).digest('hex')).toBe(listed.sha256);
      const modes = spawnSync('tar', ['-tvf', '-'], { input: archive }).stdout.toString();
      expect(modes).toMatch(/-rwxr-x--- .* workspace\/d\/a\.txt/);
    } finally {
      rmSync(out, { recursive: true, force: true });
      await cleanUp(conn);
      await t.server.close();
    }
  }, 120_000);
});

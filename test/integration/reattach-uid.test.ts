import { createHash } from 'node:crypto';
import { stat } from 'node:fs/promises';
import { afterEach, describe, expect, it } from 'vitest';
import type { BackendSandbox } from '../../src/backends/backend.js';
import { NamespaceBackend } from '../../src/backends/namespace/namespace-backend.host.js';
import { HostEnvironment } from '../../src/host/host-env.host.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';

/*
 * A server that takes running sandboxes over holds the host uids they really run as. The host
 * uid of a `host`-template sandbox is derived from its id, and a collision moves the second one
 * to the next uid; three ids that collide (found deterministically below) make the order of the
 * takeover differ from the order of creation. Were the uids derived again, the second server
 * would think b holds a's uid, and once b ended it would give a's uid to a new sandbox c while a
 * still runs with it. The owner of each workspace on disk is the uid it runs as.
 */
afterEach(expectNoLeaks);
const dataDir = testDataDir();
const spec = parseSpec({ ttlMs: 120_000 });

function collidingIds(): [string, string, string] {
  const alphabet = 'abcdefghijklmnopqrstuvwxyz234567';
  const seen = new Map<number, string[]>();
  for (let n = 0; ; n++) {
    let suffix = '';
    for (let rest = n; suffix.length < 13; rest = Math.floor(rest / 32)) suffix += alphabet[rest % 32];
    const id = `uidtest${suffix}`;
    const uid = createHash('sha256').update(id).digest().readUInt32BE(0) % 1_000_000;
    const ids = [...(seen.get(uid) ?? []), id];
    if (ids.length === 3) return ids as [string, string, string];
    seen.set(uid, ids);
  }
}

const ownerOf = async (host: HostEnvironment, id: string) => (await stat(host.volume.path(id))).uid;

describe('reattached sandboxes keep their host uids', () => {
  it('holds the uid each running sandbox has, not one derived again, so none is handed out twice', async () => {
    const [a, b, c] = collidingIds();
    const firstHost = new HostEnvironment({ dataDir });
    const first = new NamespaceBackend({ host: firstHost, supervise: true });
    const made: BackendSandbox[] = [];
    const taken: BackendSandbox[] = [];
    try {
      made.push(await first.create(spec, { id: a }), await first.create(spec, { id: b }));
      const [uidA, uidB] = [await ownerOf(firstHost, a), await ownerOf(firstHost, b)];
      expect(uidB).toBe(uidA + 1);
      for (const sandbox of made) expect(sandbox.detach?.()).toBe(true);
      made.length = 0;

      // The next server takes them over in the other order.
      const secondHost = new HostEnvironment({ dataDir });
      const second = new NamespaceBackend({ host: secondHost, supervise: true });
      const takenB = await second.reattach(b, spec);
      const takenA = await second.reattach(a, spec);
      taken.push(takenA!, takenB!);
      // b ends: what it gives back is its own uid, so c (whose id derives a's uid too) gets b's.
      await takenB!.destroy();
      taken.splice(taken.indexOf(takenB!), 1);
      taken.push(await second.create(spec, { id: c }));
      expect(await ownerOf(secondHost, c)).toBe(uidB);
      expect(await ownerOf(secondHost, a)).toBe(uidA);
      // And a still runs, as its own uid.
      const proc = await takenA!.exec({ argv: ['sh', '-c', 'echo alive > /workspace/note && cat /workspace/note'], env: { PATH: '/usr/bin:/bin' }, cwd: '/workspace' });
      let out = '';
      proc.onStdout((chunk) => (out += chunk.toString()));
      expect((await proc.exited).exitCode).toBe(0);
      expect(out).toBe('alive\n');
    } finally {
      for (const sandbox of [...made, ...taken]) await sandbox.destroy().catch(() => undefined);
    }
  }, 120_000);
});

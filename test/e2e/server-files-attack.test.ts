import { randomBytes } from 'node:crypto';
import { chmod, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectNoLeaks, testDataDir } from '../helpers/sandbox.js';
import { readNdjson, startTestServer, type TestServer } from './server-helpers.js';

/**
 * The file API over HTTP must never read or write a host file, whatever the sandbox put in its
 * workspace: symlinks to host paths, /proc/<pid>/root tricks, `..` paths. Host markers with a
 * random secret prove it.
 */
let t: TestServer;
let sandboxId: string;
const secret = randomBytes(16).toString('hex');
let marker: string;

beforeAll(async () => {
  t = await startTestServer();
  marker = join(testDataDir(), `host-marker-${secret.slice(0, 8)}.txt`);
  await writeFile(marker, `host secret ${secret}\n`);
  await chmod(marker, 0o644);
  const created = await t.json<{ sandboxId: string }>('POST', '/v1/sandboxes', { body: {} });
  expect(created.status).toBe(201);
  sandboxId = created.body.sandboxId;
  const links = [
    `ln -s ${marker} /workspace/to-marker`,
    'ln -s /etc/shadow /workspace/to-shadow',
    'ln -s /proc/1/root/etc/passwd /workspace/to-proc-root',
    'ln -s ../../../../../../ /workspace/to-up',
    `ln -s ${testDataDir()} /workspace/to-datadir`,
    'ln -s / /workspace/to-root',
  ].join('; ');
  const exec = await t.call('POST', `/v1/sandboxes/${sandboxId}/processes`, { body: { argv: ['sh', '-c', links] } });
  const events = await readNdjson(exec);
  expect(events.at(-1)).toMatchObject({ type: 'exit', result: { outcome: 'ok' } });
});

afterAll(async () => {
  await t.call('DELETE', `/v1/sandboxes/${sandboxId}`);
  await t.server.close();
  await rm(marker, { force: true });
  await expectNoLeaks();
});


const paths = [
  '/workspace/to-marker',
  '/workspace/to-shadow',
  '/workspace/to-proc-root',
  '/workspace/to-datadir/' + 'host-marker-' + secret.slice(0, 8) + '.txt',
  '/workspace/to-root/' + 'etc/shadow',
  '/workspace/to-up/etc/shadow',
  '../../../../etc/shadow',
];

describe('the file API over HTTP against symlink and traversal attacks', () => {
  it('never returns host content through a symlink, /proc/1/root or ..', async () => {
    const hostShadow = await readFile('/etc/shadow', 'utf8').catch(() => '');
    for (const path of paths) {
      const response = await t.call('GET', `/v1/sandboxes/${sandboxId}/files?path=${encodeURIComponent(path)}`);
      const body = await response.text();
      expect(body, path).not.toContain(secret);
      if (hostShadow.length > 0) expect(body, path).not.toContain(hostShadow.slice(0, 40));
      expect([200, 403, 404, 409], `${path}: ${body}`).toContain(response.status);
    }
    const listing = await t.call('GET', `/v1/sandboxes/${sandboxId}/files/list?path=${encodeURIComponent('/workspace/to-datadir')}`);
    expect(await listing.text()).not.toContain(`host-marker-${secret.slice(0, 8)}`);
  });

  it('never writes a host file through a symlink', async () => {
    for (const path of ['/workspace/to-marker', '/workspace/to-datadir/' + `host-marker-${secret.slice(0, 8)}.txt`]) {
      const response = await t.call('PUT', `/v1/sandboxes/${sandboxId}/files?path=${encodeURIComponent(path)}`, {
        raw: 'overwritten by the sandbox',
        headers: { 'content-type': 'application/octet-stream' },
      });
      await response.text();
      expect(await readFile(marker, 'utf8'), path).toBe(`host secret ${secret}\n`);
    }
    const removed = await t.call('DELETE', `/v1/sandboxes/${sandboxId}/files?path=${encodeURIComponent('/workspace/to-datadir/' + `host-marker-${secret.slice(0, 8)}.txt`)}`);
    await removed.text();
    expect(await readFile(marker, 'utf8')).toBe(`host secret ${secret}\n`);
  });
});

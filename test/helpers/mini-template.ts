import { spawnSync } from 'node:child_process';
import { chmod, chown, copyFile, mkdir, readFile, stat, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { WorkspaceVolume } from '../../src/host/volume.host.js';
import type { TemplateCatalog, TemplateImage } from '../../src/engine/templates.js';
import { HOST_IMAGE } from '../../src/engine/templates.js';

/** Programs the runtime tests run inside a template sandbox; each with its shared libraries. */
const PROGRAMS = ['/bin/sh', '/usr/bin/id', '/usr/bin/touch', '/usr/bin/chown', '/usr/bin/ls', '/usr/bin/cat', '/usr/bin/stat',
  '/usr/bin/mkdir', '/usr/bin/sleep', '/usr/bin/unshare', '/usr/bin/grep', '/usr/bin/head', '/usr/bin/dd', '/usr/bin/rm', '/usr/bin/whoami', '/usr/bin/true'];

function run(argv: string[]): string {
  const result = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8' });
  if (result.status !== 0) throw new Error(`${argv.join(' ')} failed: ${result.stderr}`);
  return result.stdout;
}

/** The host files a program needs: itself, its shared libraries and the dynamic loader. */
function closure(program: string): string[] {
  const files = new Set<string>([program]);
  for (const line of run(['ldd', program]).split('\n')) {
    const path = /=>\s+(\/\S+)/.exec(line)?.[1] ?? /^\s*(\/\S+)\s+\(/.exec(line)?.[1];
    if (path) files.add(path);
  }
  return [...files];
}

/**
 * A small template layer made from a few host programs (no network, a second): a root with
 * /etc/passwd naming root and `user` (1000), owned by raw ids as a real template is. Made once per
 * test run on the run's volume and shared (it is read-only).
 */
export async function miniTemplateLayer(volume: WorkspaceVolume): Promise<string> {
  await volume.ensure();
  const layer = join(volume.mountPoint, 'layer-test-mini');
  if (existsSync(layer)) return layer;
  const work = `${layer}.tmp`;
  if (existsSync(work)) run(['btrfs', 'subvolume', 'delete', work]);
  run(['btrfs', 'subvolume', 'create', work]);
  await chmod(work, 0o755);
  for (const dir of ['etc', 'root', 'home/user', 'tmp', 'proc', 'dev', 'workspace', 'usr/bin', 'usr/lib', 'usr/lib64']) {
    await mkdir(join(work, dir), { recursive: true, mode: 0o755 });
  }
  for (const link of [['usr/bin', 'bin'], ['usr/lib', 'lib'], ['usr/lib64', 'lib64']]) run(['ln', '-s', link[0]!, join(work, link[1]!)]);
  for (const file of new Set(PROGRAMS.flatMap(closure))) {
    const real = run(['readlink', '-f', file]).trim();
    const target = join(work, file.replace(/^\/(bin|lib|lib64)\//, '/usr/$1/'));
    await mkdir(dirname(target), { recursive: true });
    await copyFile(real, target);
    await chmod(target, (await stat(real)).mode & 0o7777);
  }
  await writeFile(join(work, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n');
  await writeFile(join(work, 'etc/group'), 'root:x:0:\nuser:x:1000:\nstaff:x:50:user\nnogroup:x:65534:\n');
  await chmod(join(work, 'root'), 0o700);
  await chmod(join(work, 'tmp'), 0o1777);
  await chown(join(work, 'home/user'), 1000, 1000);
  await writeFile(join(work, 'etc/template-marker'), 'mini\n');
  run(['btrfs', 'subvolume', 'snapshot', '-r', work, layer]);
  run(['btrfs', 'subvolume', 'delete', work]);
  return layer;
}

/** A catalog with the host template and `mini` (the layer above, user `user`, workdir /home/user). */
export function miniCatalog(layerDir: string, extra: Partial<TemplateImage> = {}): TemplateCatalog {
  return {
    defaultRef: 'host',
    resolve: (_tenant, ref) => {
      if (ref === 'host') return Promise.resolve(HOST_IMAGE);
      if (ref === 'mini' || ref === 'mini:latest') return Promise.resolve({ ref: 'mini:latest', layerDir, env: { FROM_TEMPLATE: 'yes' }, user: 'user', workdir: '/home/user', ...extra });
      return Promise.reject(new Error(`no template ${ref}`));
    },
  };
}

/** Whether the layer still holds only what it was made with (a sandbox never writes to it). */
export async function layerMarker(layerDir: string): Promise<string> {
  return readFile(join(layerDir, 'etc/template-marker'), 'utf8');
}

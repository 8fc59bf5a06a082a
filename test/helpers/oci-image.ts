import { spawnSync } from 'node:child_process';
import { chown, mkdir, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import { join } from 'node:path';

function run(argv: string[], env?: NodeJS.ProcessEnv): string {
  const result = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8', env: env ?? process.env, timeout: 120_000 });
  if (result.status !== 0) throw new Error(`${argv.join(' ')} failed (${result.status}): ${result.stderr}`);
  return result.stdout;
}

export interface TinyImageOptions {
  /** Owner (uid:gid) of /opt/owned; 70000 makes an image a sandbox cannot map. @default 1001 */
  ownedBy?: number;
}

/**
 * Builds a tiny image with umoci in `layout` under `tag`, as the tests need it: a base layer with
 * /etc/passwd (root, app 1001), /etc/motd, /etc/keep/k, /etc/conf.d/{a,b}, /opt/owned (1001:1001);
 * then a layer adding /opt/hello.txt, a whiteout layer removing /etc/motd, an opaque layer
 * replacing /etc/conf.d by {c}; config Env A=1, WorkingDir /opt, User app, Entrypoint /bin/sh -c,
 * Cmd "echo hi".
 */
export async function buildTinyImage(work: string, layout: string, tag: string, options: TinyImageOptions = {}): Promise<void> {
  const owner = options.ownedBy ?? 1001;
  const root = join(work, `rootfs-${tag}`);
  for (const dir of ['etc/keep', 'etc/conf.d', 'opt/owned', 'home/app', 'bin']) await mkdir(join(root, dir), { recursive: true });
  await writeFile(join(root, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\napp:x:1001:1001::/home/app:/bin/sh\n');
  await writeFile(join(root, 'etc/group'), 'root:x:0:\napp:x:1001:\n');
  await writeFile(join(root, 'etc/motd'), 'welcome\n');
  await writeFile(join(root, 'etc/keep/k'), 'kept\n');
  await writeFile(join(root, 'etc/conf.d/a'), 'a\n');
  await writeFile(join(root, 'etc/conf.d/b'), 'b\n');
  await writeFile(join(root, 'opt/owned/file'), 'mine\n');
  await chown(join(root, 'opt/owned'), owner, owner);
  await chown(join(root, 'opt/owned/file'), owner, owner);
  await chown(join(root, 'home/app'), 1001, 1001);
  const base = join(work, `base-${tag}.tar`);
  run(['tar', '--numeric-owner', '-C', root, '-cf', base, '.']);
  await writeFile(join(work, 'hello.txt'), 'hello from the image\n');
  await mkdir(join(work, 'confdir'), { recursive: true });
  await writeFile(join(work, 'confdir/c'), 'c\n');
  const image = `${layout}:${tag}`;
  if (!existsSync(layout)) run(['umoci', 'init', '--layout', layout]);
  run(['umoci', 'new', '--image', image]);
  run(['umoci', 'raw', 'add-layer', '--image', image, base]);
  run(['umoci', 'insert', '--image', image, join(work, 'hello.txt'), '/opt/hello.txt']);
  run(['umoci', 'insert', '--image', image, '--whiteout', '/etc/motd']);
  run(['umoci', 'insert', '--image', image, '--opaque', join(work, 'confdir'), '/etc/conf.d']);
  run(['umoci', 'config', '--image', image, '--config.env', 'A=1', '--config.env', 'PATH=/bin', '--config.workingdir', '/opt', '--config.user', 'app', '--config.entrypoint', '/bin/sh', '--config.cmd', '-c', '--config.cmd', 'echo hi']);
}

/** Pushes `layout:tag` to a loopback registry (plain HTTP), with credentials from an auth file if given. */
export async function pushImage(work: string, layout: string, tag: string, destination: string, auth?: { username: string; password: string }): Promise<void> {
  const policy = join(work, 'policy.json');
  await writeFile(policy, JSON.stringify({ default: [{ type: 'insecureAcceptAnything' }] }));
  const args = ['skopeo', '--policy', policy, 'copy', '--quiet', '--dest-tls-verify=false'];
  if (auth) {
    const registry = destination.split('/')[0]!;
    const file = join(work, 'push-auth.json');
    await writeFile(file, JSON.stringify({ auths: { [registry]: { auth: Buffer.from(`${auth.username}:${auth.password}`).toString('base64') } } }), { mode: 0o600 });
    args.push('--dest-authfile', file);
  }
  run([...args, `oci:${layout}:${tag}`, `docker://${destination}`], { PATH: process.env.PATH, HOME: work });
}

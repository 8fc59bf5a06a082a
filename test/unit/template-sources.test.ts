import { describe, expect, it } from 'vitest';
import { aptSourceHosts, hasSources, osCodename, renameSuite, signedByPaths } from '../../src/templates/debian/apt-sources.js';
import { bootstrapPackages, mmdebstrapArgv } from '../../src/templates/debian/mmdebstrap-args.js';
import { readImageConfig, runtimeConfig } from '../../src/templates/oci/image-config.js';
import { resolveUserSpec } from '../../src/templates/rootfs/users.js';
import { BuildLog, type LogEntry } from '../../src/templates/build-log.js';
import { isIgnored, parseDockerignore } from '../../src/templates/dockerfile/dockerignore.js';

const DEB822 = `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: https://security.debian.org/debian-security
Suites: bookworm-security
Components: main
`;

describe('apt sources for a bootstrap', () => {
  it('renames the host suite in deb822 and one-line files, keeping everything else', () => {
    expect(renameSuite(DEB822, 'bookworm', 'trixie')).toBe(DEB822.replace('Suites: bookworm bookworm-updates', 'Suites: trixie trixie-updates').replace('Suites: bookworm-security', 'Suites: trixie-security'));
    expect(renameSuite('deb [signed-by=/k.gpg arch=amd64] http://deb.debian.org/debian bookworm-backports main\n# deb x bookworm main', 'bookworm', 'trixie')).toBe(
      'deb [signed-by=/k.gpg arch=amd64] http://deb.debian.org/debian trixie-backports main\n# deb x bookworm main',
    );
    expect(renameSuite('deb https://deb.nodesource.com/node_20.x nodistro main', 'bookworm', 'trixie')).toBe('deb https://deb.nodesource.com/node_20.x nodistro main');
  });

  it('finds keyrings, enabled sources, the codename and the hosts a build may reach', () => {
    expect(signedByPaths(DEB822)).toEqual(['/usr/share/keyrings/debian-archive-keyring.gpg']);
    expect(signedByPaths('deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] https://a.example/x stable main')).toEqual(['/usr/share/keyrings/x.gpg']);
    expect(hasSources('# deb http://x bookworm main\n')).toBe(false);
    expect(hasSources(DEB822)).toBe(true);
    expect(osCodename('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nVERSION_CODENAME=bookworm\n')).toBe('bookworm');
    expect(aptSourceHosts(`${DEB822}\ndeb http://deb.debian.org/debian bookworm-backports main\ndeb cdrom:[x]/ bookworm main\n`)).toEqual(['deb.debian.org:80', 'security.debian.org:443']);
  });

  it('runs mmdebstrap in root mode, apt variant, straight into the target, with the template user', () => {
    const argv = mmdebstrapArgv({ suite: 'bookworm', packages: ['python3', 'curl'], target: '/v/root', sources: ['/etc/apt/sources.list.d/debian.sources'], keyrings: ['/usr/share/keyrings/x.gpg'] });
    expect(argv).toEqual([
      '/usr/bin/mmdebstrap',
      '--mode=root',
      '--variant=apt',
      '--include=ca-certificates,curl,iproute2,procps,python3',
      '--customize-hook=mkdir -p "$1/usr/share/keyrings"',
      '--customize-hook=copy-in /usr/share/keyrings/x.gpg /usr/share/keyrings',
      '--customize-hook=chroot "$1" useradd --create-home --home-dir /home/user --uid 1000 --user-group --shell /bin/bash user',
      'bookworm',
      '/v/root',
      '/etc/apt/sources.list.d/debian.sources',
    ]);
  });

  it('refuses package and suite names that are not Debian names (they reach argv)', () => {
    expect(() => bootstrapPackages(['--option=x'])).toThrow(/not a Debian package name/);
    expect(() => bootstrapPackages(['a b'])).toThrow(/not a Debian package name/);
    expect(bootstrapPackages(['python3=3.11.2-1+b1'])).toContain('python3=3.11.2-1+b1');
    expect(() => mmdebstrapArgv({ suite: '../x', packages: [], target: '/t', sources: [], keyrings: [] })).toThrow(/not a Debian suite/);
  });
});

describe('image config', () => {
  it('keeps Env, WorkingDir, User and Entrypoint + Cmd', () => {
    expect(runtimeConfig({ Env: ['PATH=/bin', 'A=b=c'], WorkingDir: '/app', User: '1000:1000', Entrypoint: ['/bin/sh', '-c'], Cmd: ['echo hi'] })).toEqual({
      env: { PATH: '/bin', A: 'b=c' },
      workdir: '/app',
      user: '1000:1000',
      startCmd: "/bin/sh -c 'echo hi'",
    });
    expect(runtimeConfig({})).toEqual({ env: {}, workdir: '/', user: 'root' });
  });

  it('follows index.json through an image index to the linux/amd64 manifest', async () => {
    const blobs: Record<string, string> = {
      'sha256:idx': JSON.stringify({ manifests: [{ digest: 'sha256:arm', platform: { os: 'linux', architecture: 'arm64' } }, { digest: 'sha256:amd', platform: { os: 'linux', architecture: 'amd64' } }] }),
      'sha256:amd': JSON.stringify({ config: { digest: 'sha256:cfg' } }),
      'sha256:cfg': JSON.stringify({ config: { User: 'app', Cmd: ['run'] } }),
    };
    const index = JSON.stringify({ manifests: [{ mediaType: 'application/vnd.oci.image.index.v1+json', digest: 'sha256:idx', annotations: { 'org.opencontainers.image.ref.name': 'v1' } }] });
    const config = await readImageConfig(index, 'v1', (d) => Promise.resolve(blobs[d]!));
    expect(config).toEqual({ env: {}, workdir: '/', user: 'app', startCmd: 'run' });
    await expect(readImageConfig(index, 'v2', (d) => Promise.resolve(blobs[d]!))).rejects.toMatchObject({ code: 'IMAGE_UNSUPPORTED' });
  });

  it('resolves users as Docker does and refuses ids a sandbox cannot map', () => {
    const passwd = 'root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\nbig:x:70000:70000::/:/bin/sh\n';
    const group = 'root:x:0:\nstaff:x:50:\nuser:x:1000:\n';
    expect(resolveUserSpec('user', passwd, group)).toEqual({ uid: 1000, gid: 1000 });
    expect(resolveUserSpec('user:staff', passwd, group)).toEqual({ uid: 1000, gid: 50 });
    expect(resolveUserSpec('1000', passwd, group)).toEqual({ uid: 1000, gid: 1000 });
    expect(resolveUserSpec('4242', passwd, group)).toEqual({ uid: 4242, gid: 0 });
    expect(resolveUserSpec('4242:7', passwd, group)).toEqual({ uid: 4242, gid: 7 });
    expect(resolveUserSpec('nobody', passwd, group)).toMatch(/not in the template's \/etc\/passwd/);
    expect(resolveUserSpec('user:wheel', passwd, group)).toMatch(/group "wheel"/);
    expect(resolveUserSpec('big', passwd, group)).toMatch(/at most 65535/);
    expect(resolveUserSpec('0:65536', passwd, group)).toMatch(/at most 65535/);
  });
});

describe('.dockerignore', () => {
  const patterns = parseDockerignore(['# comment', 'node_modules', '*.log', '!keep.log', '**/secret*', '/build/', 'docs/**/*.md', '!docs/README.md', 'a?c', '[xy].txt'].join('\n'));
  const ignored = (path: string) => isIgnored(path, patterns);

  it('applies Go wildcards, ** and exceptions in order, to paths and their parents', () => {
    expect(ignored('node_modules')).toBe(true);
    expect(ignored('node_modules/x/index.js')).toBe(true);
    expect(ignored('app.log')).toBe(true);
    expect(ignored('keep.log')).toBe(false);
    expect(ignored('sub/app.log')).toBe(false);
    expect(ignored('secret.txt')).toBe(true);
    expect(ignored('a/b/secret.key')).toBe(true);
    expect(ignored('build/out.bin')).toBe(true);
    expect(ignored('docs/a/b.md')).toBe(true);
    expect(ignored('docs/x.md')).toBe(true);
    expect(ignored('docs/README.md')).toBe(false);
    expect(ignored('abc')).toBe(true);
    expect(ignored('abbc')).toBe(false);
    expect(ignored('x.txt')).toBe(true);
    expect(ignored('z.txt')).toBe(false);
    expect(ignored('src/main.ts')).toBe(false);
  });
});

describe('build log', () => {
  it('streams every entry and keeps a bounded window with a dropped count', () => {
    const seen: LogEntry[] = [];
    const log = new BuildLog({ onLog: (e) => seen.push(e), maxEntries: 10, now: () => new Date('2026-01-01T00:00:00Z') });
    for (let i = 0; i < 25; i++) log.info(String(1 + (i % 2)), `line ${i}`);
    expect(seen).toHaveLength(25);
    expect(seen[0]).toEqual({ timestamp: '2026-01-01T00:00:00.000Z', level: 'info', message: 'line 0', step: '1' });
    const kept = log.entries().map((e) => e.message);
    expect(kept).toHaveLength(10);
    expect(kept.slice(0, 2)).toEqual(['line 0', 'line 1']);
    expect(kept.at(-1)).toBe('line 24');
    expect(log.dropped).toBe(15);
    expect(log.lastLines('1', 2)).toEqual(['line 22', 'line 24']);
  });

  it('cuts long messages', () => {
    const log = new BuildLog({ maxMessageChars: 5 });
    log.info('1', 'abcdefgh');
    expect(log.entries()[0]!.message).toBe('abcde…');
  });
});

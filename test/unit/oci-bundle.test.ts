import { describe, expect, it } from 'vitest';
import { buildOciSpec, buildRunscFlags, hostPidsBackstop, type OciBundleOptions } from '../../src/backends/gvisor/oci-bundle.js';
import { parseSpec } from '../../src/sandbox-spec/index.js';

const MiB = 1024 * 1024;
const options: OciBundleOptions = {
  rootfsDir: '/data/gvisor/bundles/s1/rootfs',
  workspaceDir: '/data/volume/ws-s1',
  etcDir: '/data/sandbox-etc',
  toolsDir: '/data/bin',
  hostUid: 4_123_456,
  cgroupsPath: 'capsule-abcdef-s1',
  mountSources: ['/data/gvisor/bundles/s1/mnt/0'],
};

describe('buildOciSpec', () => {
  const spec = parseSpec({
    backend: 'gvisor',
    env: { SECRET_LOOKING: 'x' },
    limits: { memoryBytes: 256 * MiB, cpus: 1.5, pids: 50, fileSizeBytes: 5 * MiB, openFiles: 200, tmpBytes: 8 * MiB, shmBytes: 4 * MiB },
    mounts: [{ root: 'data', subpath: 'in', sandboxPath: '/input' }],
  });
  const oci = buildOciSpec(spec, options);

  it('runs the agent as uid 1000 with no capabilities, no_new_privs and an empty environment', () => {
    expect(oci.process.args).toEqual(['/.capsule/capsule-agent']);
    expect(oci.process.user).toEqual({ uid: 1000, gid: 1000, additionalGids: [] });
    expect(oci.process.noNewPrivileges).toBe(true);
    for (const set of Object.values(oci.process.capabilities)) expect(set).toEqual([]);
    // The spec's env goes with each exec through the agent, never into the container's init.
    expect(oci.process.env).toEqual([]);
    expect(oci.process.cwd).toBe('/workspace');
  });

  it('sets the file-size, open-file and process rlimits from the spec', () => {
    expect(oci.process.rlimits).toEqual([
      { type: 'RLIMIT_FSIZE', hard: 5 * MiB, soft: 5 * MiB },
      { type: 'RLIMIT_NOFILE', hard: 200, soft: 200 },
      { type: 'RLIMIT_NPROC', hard: 50, soft: 50 },
      { type: 'RLIMIT_CORE', hard: 0, soft: 0 },
    ]);
  });

  it('makes the root read-only and writable places explicit: the workspace and a sized /tmp', () => {
    expect(oci.root).toEqual({ path: options.rootfsDir, readonly: true });
    const byDestination = new Map(oci.mounts.map((m) => [m.destination, m]));
    expect(byDestination.get('/workspace')).toEqual({ destination: '/workspace', type: 'bind', source: options.workspaceDir, options: ['rbind', 'rw', 'nosuid', 'nodev'] });
    expect(byDestination.get('/tmp')?.options).toContain(`size=${8 * MiB}`);
    expect(byDestination.get('/dev/shm')).toEqual({ destination: '/dev/shm', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'nodev', 'mode=1777', `size=${4 * MiB}`] });
    const writable = oci.mounts.filter((m) => m.type === 'bind' && !m.options?.includes('ro')).map((m) => m.destination);
    expect(writable).toEqual(['/workspace']);
  });

  it('binds /usr, the prepared /etc, spec mounts and the tools read-only', () => {
    const ro = oci.mounts.filter((m) => m.options?.includes('ro')).map((m) => `${m.destination}<-${m.source}`);
    expect(ro).toEqual(['/usr<-/usr', '/etc<-/data/sandbox-etc', '/input<-/data/gvisor/bundles/s1/mnt/0', '/.capsule<-/data/bin']);
  });

  it('binds a host mount from where the launcher attached it, not recursively, never from a tenant path', () => {
    const input = oci.mounts.find((m) => m.destination === '/input');
    expect(input).toEqual({ destination: '/input', type: 'bind', source: '/data/gvisor/bundles/s1/mnt/0', options: ['bind', 'ro', 'nosuid', 'nodev'] });
    expect(() => buildOciSpec(spec, { ...options, mountSources: [] })).toThrow(/mounts\[0\]/);
  });

  it('binds volumes from where the launcher attached them, read-only when asked, never from a tenant path', () => {
    const withVolumes = parseSpec({ backend: 'gvisor', volumes: [{ name: 'data', path: '/data' }, { name: 'refs', path: '/refs', readOnly: true }] });
    const sources = ['/data/gvisor/bundles/s1/vol/0', '/data/gvisor/bundles/s1/vol/1'];
    const bound = buildOciSpec(withVolumes, { ...options, mountSources: [], volumeSources: sources });
    expect(bound.mounts.filter((m) => m.destination === '/data' || m.destination === '/refs')).toEqual([
      { destination: '/data', type: 'bind', source: sources[0], options: ['bind', 'rw', 'nosuid', 'nodev'] },
      { destination: '/refs', type: 'bind', source: sources[1], options: ['bind', 'ro', 'nosuid', 'nodev'] },
    ]);
    expect(() => buildOciSpec(withVolumes, { ...options, mountSources: [] })).toThrow(/volumes\[0\]/);
    // A template's volumes are staged by the launcher (idmapped), like its root.
    const staged = buildOciSpec(withVolumes, { ...options, mountSources: [], template: { hostBase: 0x10000000, size: 65536 } });
    expect(staged.mounts.filter((m) => m.destination === '/data' || m.destination === '/refs').map((m) => `${m.destination}<-${m.source}:${m.options?.[1] ?? ''}`)).toEqual([
      '/data<-/run/capsule-stage/volume-0:rw',
      '/refs<-/run/capsule-stage/volume-1:ro',
    ]);
  });

  it("binds a network's resolv.conf over the prepared one", () => {
    const networked = buildOciSpec(spec, { ...options, resolvConf: '/run/capsule/net-s1/resolv.conf' });
    expect(networked.mounts.filter((m) => m.destination.startsWith('/etc')).map((m) => `${m.destination}<-${m.source}`)).toEqual([
      '/etc<-/data/sandbox-etc',
      '/etc/resolv.conf<-/run/capsule/net-s1/resolv.conf',
    ]);
  });

  it('maps the sandbox user to a host uid of its own, and root to root', () => {
    expect(oci.linux.namespaces.map((n) => n.type)).toEqual(['pid', 'network', 'ipc', 'uts', 'mount', 'user']);
    expect(oci.linux.uidMappings).toEqual([
      { containerID: 0, hostID: 0, size: 1 },
      { containerID: 1000, hostID: 4_123_456, size: 1 },
    ]);
    expect(oci.linux.gidMappings).toEqual(oci.linux.uidMappings);
  });

  it('puts memory, cpu and a pids backstop in the cgroup runsc joins', () => {
    expect(oci.linux.cgroupsPath).toBe('/capsule-abcdef-s1');
    expect(oci.linux.resources).toEqual({
      memory: { limit: 256 * MiB, swap: 256 * MiB },
      cpu: { quota: 150_000, period: 100_000 },
      pids: { limit: hostPidsBackstop(50) },
    });
    expect(hostPidsBackstop(50)).toBeGreaterThan(50);
  });

  it('is deterministic', () => {
    expect(buildOciSpec(spec, options)).toEqual(oci);
  });
});

describe('buildRunscFlags', () => {
  it('pins the state root, platform and network, and never the host network', () => {
    expect(buildRunscFlags({ rootDir: '/data/runsc', platform: 'systrap', network: 'none' })).toEqual([
      '--root', '/data/runsc', '--rootless=false', '--platform=systrap', '--network=none', '--overlay2=none',
    ]);
    expect(buildRunscFlags({ rootDir: '/r', platform: 'ptrace', network: 'sandbox', debugLogDir: '/logs' })).toEqual([
      '--root', '/r', '--rootless=false', '--platform=ptrace', '--network=sandbox', '--overlay2=none', '--debug', '--debug-log=/logs/',
    ]);
  });
});

import { z } from 'zod';

const MiB = 1024 * 1024;

/** Environment variable names a POSIX shell accepts; values may not carry NUL bytes. */
const envName = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a valid environment variable name');
const noNul = z.string().refine((s) => !s.includes('\0'), 'must not contain NUL bytes');
const absolutePath = noNul.refine((p) => p.startsWith('/'), 'must be an absolute path');

/**
 * Resource limits. Every limit is on by default and finite; units are in the names.
 * A limit that ends work is reported as `limit_exceeded` with the resource, never as a crash.
 */
export const LimitsSchema = z.strictObject({
  /** CPU cores (a quota, may be fractional). @default 1 */
  cpus: z.number().positive().max(64).default(1),
  /** Wall-clock time of a run or of one process, in real time (not CPU time). @default 30000 */
  wallClockMs: z.number().int().positive().default(30_000),
  /** Memory including tmpfs pages and kernel memory of the sandbox. @default 512 MiB */
  memoryBytes: z.number().int().min(16 * MiB).default(512 * MiB),
  /** Fraction of `memoryBytes` at which a warning is emitted before the OOM kill. @default 0.8 */
  memoryWarnRatio: z.number().gt(0).lt(1).default(0.8),
  /** Processes and threads at once. @default 128 */
  pids: z.number().int().min(4).default(128),
  /** Bytes the workspace may hold. @default 512 MiB */
  diskBytes: z.number().int().min(MiB).default(512 * MiB),
  /** Largest single file a process may write (RLIMIT_FSIZE). @default 64 MiB */
  fileSizeBytes: z.number().int().min(1024).default(64 * MiB),
  /** Size of the private /tmp (tmpfs, counted in memory). @default 64 MiB */
  tmpBytes: z.number().int().min(MiB).default(64 * MiB),
  /** Size of /dev/shm (POSIX shared memory, a tmpfs counted in memory). @default 64 MiB */
  shmBytes: z.number().int().min(MiB).default(64 * MiB),
  /** Open file descriptors per process (RLIMIT_NOFILE). @default 1024 */
  openFiles: z.number().int().min(16).max(65_536).default(1024),
  /** Bytes of stdout kept per run or process; the rest is dropped and flagged. @default 1 MiB */
  stdoutBytes: z.number().int().min(0).default(MiB),
  /** Bytes of stderr kept per run or process; the rest is dropped and flagged. @default 1 MiB */
  stderrBytes: z.number().int().min(0).default(MiB),
});

export const NETWORK_MODES = ['none', 'allowlist', 'internet'] as const;

const DOMAIN_LABEL = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/;

/**
 * Why an allowlist entry is refused, or undefined when it is valid. Entries are a domain
 * (`api.github.com`), a wildcard over a domain's subdomains (`*.pypi.org`), either with an optional
 * port (`:443`), or an IPv4/IPv6 address or CIDR (`203.0.113.0/24`). A bare TLD, `*`, a wildcard
 * over a TLD and a /0 are refused: they would open everything while looking like a restriction.
 */
export function allowEntryProblem(entry: string): string | undefined {
  const text = entry.trim().toLowerCase();
  if (text === '*' || text === '*.*') return 'a wildcard over everything is not an allowlist; use mode "internet"';
  const cidr = /^([0-9.]+|[0-9a-f:]+)(?:\/(\d{1,3}))?$/.exec(text);
  if (cidr && (cidr[1]?.includes(':') || /^\d+\.\d+\.\d+\.\d+$/.test(cidr[1] ?? ''))) {
    const ip = cidr[1] ?? '';
    const v4 = !ip.includes(':');
    if (v4 && ip.split('.').some((octet) => Number(octet) > 255)) return 'not a valid IPv4 address';
    if (cidr[2] !== undefined) {
      const bits = Number(cidr[2]);
      if (bits > (v4 ? 32 : 128)) return 'the prefix length is too long';
      if (bits < (v4 ? 8 : 16)) return 'a CIDR this wide is not an allowlist; use mode "internet"';
    }
    return undefined;
  }
  const hostPort = /^(\*\.)?([a-z0-9.-]+?)(?::(\d{1,5}))?$/.exec(text);
  if (!hostPort) return 'must be a domain (api.github.com), a wildcard (*.pypi.org), optionally with :port, or a CIDR';
  const port = hostPort[3] === undefined ? undefined : Number(hostPort[3]);
  if (port !== undefined && (port < 1 || port > 65_535)) return 'the port must be between 1 and 65535';
  const labels = (hostPort[2] ?? '').split('.');
  if (labels.some((label) => !DOMAIN_LABEL.test(label))) return 'not a valid domain name';
  if (labels.length < 2) return 'a bare top-level domain is too wide; name the domain (example.com)';
  if (/^\d+$/.test(labels[labels.length - 1] ?? '')) return 'not a valid domain name (use a CIDR for addresses)';
  return undefined;
}

export const NetworkPolicySchema = z.strictObject({
  /** `none`: only loopback inside. @default 'none' */
  mode: z.enum(NETWORK_MODES).default('none'),
  /** Domains (`api.github.com:443`, `*.pypi.org`) and CIDRs reachable in `allowlist` mode. */
  allow: z
    .array(
      z
        .string()
        .min(1)
        .max(253)
        .superRefine((entry, ctx) => {
          const problem = allowEntryProblem(entry);
          if (problem) ctx.addIssue({ code: 'custom', message: `allow entry "${entry}": ${problem}` });
        }),
    )
    .max(256)
    .default([]),
  /** Credential-broker handles the sandbox may use. */
  handles: z.array(z.string().regex(/^[a-z0-9][a-z0-9._-]{0,63}$/)).max(64).default([]),
  /**
   * Outbound connections (tunnels and proxied requests) the sandbox may open over its lifetime;
   * past it the proxy answers 429 and the work is reported as an `egress` limit. @default 4096
   */
  maxConnections: z.number().int().positive().max(1_000_000).default(4096),
  /**
   * Connections to the egress proxy the sandbox may hold open at once: each tunnel, proxied or
   * redirected request and broker request counts from the proxy's accept until it closes, and
   * so does each upstream connection the proxy opens for it. Past it a new connection is reset
   * (a request answered 429) and the work is reported as an `egress` limit; the operator's
   * maximum bounds it. @default 256
   */
  maxConcurrentConnections: z.number().int().positive().max(65_536).default(256),
  /**
   * Ports inside the sandbox anyone may reach through the server's port URLs
   * (`/v1/sandboxes/ID/ports/P/`, `http://P-ID.DOMAIN/`) without a token. Other ports need the
   * tenant's API key, the sandbox's access token or a signed URL. Inbound only: the outbound
   * policy is unchanged. @default []
   */
  publicPorts: z.array(z.number().int().min(1).max(65_535)).max(64).default([]),
}).superRefine((policy, ctx) => {
  if (policy.mode === 'none' && policy.handles.length > 0) {
    ctx.addIssue({
      code: 'custom',
      path: ['handles'],
      message: 'credential handles need a network: set network.mode to "allowlist" (an empty allow list reaches only the broker)',
    });
  }
});

/** Names of the operator's mount roots (`capsule serve --mount-root NAME=PATH`). */
export const MOUNT_ROOT_NAME = /^[a-z0-9][a-z0-9_-]{0,63}$/;

/** A template reference: `name`, `name:tag`, names with `/` as E2B and registries use them. */
export const TEMPLATE_REF = /^[a-z0-9][a-z0-9._/-]{0,127}(?::[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127})?$/;
/** A user of a sandbox: a name, a uid, or uid:gid. */
export const USER_REF = /^(?:[a-z_][a-z0-9_.-]{0,31}|\d{1,10}(?::\d{1,10})?)$/;
/** The template that is the host's own /usr (read-only), as sandboxes were before templates. */
export const HOST_TEMPLATE = 'host';

/** Where nothing may be mounted: the sandbox's kernel views and Capsule's own tools. */
const RESERVED_MOUNT_PATHS = ['/proc', '/dev', '/sys', '/.capsule'];

/** Why a sandboxPath is refused, or undefined: it must be normal (no `.`, `..`, `//`, trailing `/`). */
export function sandboxPathProblem(path: string): string | undefined {
  if (path === '/') return 'cannot mount over /';
  if (path.split('/').slice(1).some((part) => part === '' || part === '.' || part === '..')) {
    return 'must be a normal absolute path (no ".", "..", "//" or trailing "/")';
  }
  const reserved = RESERVED_MOUNT_PATHS.find((prefix) => path === prefix || path.startsWith(`${prefix}/`));
  return reserved ? `${reserved} is the sandbox's own and cannot be mounted over` : undefined;
}

/**
 * A read-only host mount: a root the operator named and granted to the caller's key, and a path
 * under it. The host path itself never appears on the wire.
 */
export const MountSchema = z.strictObject({
  /** Name of a mount root the operator granted to this API key. */
  root: z.string().regex(MOUNT_ROOT_NAME, 'must be the name of a mount root (lowercase letters, digits, "_", "-")'),
  /** Relative path under the root (no symlinks, no ".."). @default the root itself */
  subpath: noNul.max(4096).optional(),
  /** Where the sandbox sees it, e.g. `/input`. */
  sandboxPath: absolutePath.max(4096).superRefine((path, ctx) => {
    const problem = sandboxPathProblem(path);
    if (problem) ctx.addIssue({ code: 'custom', message: problem });
  }),
  /** Host mounts are read-only; a writable host mount would let a sandbox change the host. */
  readOnly: z.literal(true).default(true),
});

/** Volume names: lowercase letters, digits, ".", "_", "-"; unique per tenant. */
export const VOLUME_NAME = /^[a-z0-9][a-z0-9._-]{0,62}$/;

/** A named volume of the tenant (`/v1/volumes`), mounted at `path`, writable unless `readOnly`. */
export const VolumeMountSchema = z.strictObject({
  name: z.string().regex(VOLUME_NAME, 'must be a volume name (lowercase letters, digits, "._-")'),
  path: absolutePath.max(4096).superRefine((path, ctx) => {
    const problem = sandboxPathProblem(path);
    if (problem) ctx.addIssue({ code: 'custom', message: problem });
  }),
  readOnly: z.boolean().default(false),
});

export const BACKENDS = ['namespace', 'gvisor'] as const;

/** A sandbox is created from exactly this. With no options it is the least capable sandbox. */
export const SandboxSpecSchema = z.strictObject({
  /** Isolation backend. @default 'namespace' */
  backend: z.enum(BACKENDS).default('namespace'),
  /**
   * The environment the sandbox is made from: a template `name[:tag]` (its root, copy-on-write and
   * private to the sandbox, root inside), or `host` (the host's own /usr read-only, uid 1000, no
   * root: the fastest one-shot runs). @default the operator's default template
   */
  template: z.string().regex(TEMPLATE_REF, 'must be a template name[:tag] (lowercase letters, digits, "._-/"), or "host"').optional(),
  /**
   * The user processes run as when a call names none: `root`, or a user name, uid or uid:gid of
   * the template. @default the template's user (`user`, uid 1000, on the host template)
   */
  user: z.string().regex(USER_REF, 'must be a user name, a uid or uid:gid').optional(),
  /**
   * Start from one of the tenant's snapshots (`snap_...`): its root and workspace, copy-on-write,
   * with its template, and its backend unless the spec names one. @default none
   */
  snapshot: z.string().regex(/^snap_[a-z2-7]{20}$/, 'must be a snapshot id (snap_...)').optional(),
  limits: LimitsSchema.default(LimitsSchema.parse({})),
  network: NetworkPolicySchema.default(NetworkPolicySchema.parse({})),
  /** The complete environment of processes; nothing of the host's is inherited. @default {} */
  env: z.record(envName, noNul).default({}),
  /** Read-only host mounts from the operator's granted roots. @default [] */
  mounts: z
    .array(MountSchema)
    .max(16)
    .default([])
    .superRefine((mounts, ctx) => {
      const seen = new Set<string>();
      mounts.forEach((mount, index) => {
        if (seen.has(mount.sandboxPath)) ctx.addIssue({ code: 'custom', path: [index, 'sandboxPath'], message: 'two mounts at the same sandboxPath' });
        seen.add(mount.sandboxPath);
      });
    }),
  /** The tenant's named volumes, mounted at their paths (they outlive the sandbox). @default [] */
  volumes: z
    .array(VolumeMountSchema)
    .max(8)
    .default([])
    .superRefine((volumes, ctx) => {
      const seen = new Set<string>();
      volumes.forEach((volume, index) => {
        if (seen.has(volume.path)) ctx.addIssue({ code: 'custom', path: [index, 'path'], message: 'two volumes at the same path' });
        seen.add(volume.path);
      });
    }),
  /** Working directory of processes. @default '/workspace' */
  cwd: absolutePath.default('/workspace'),
  /** Time to live of a durable sandbox. @default 300000 */
  ttlMs: z.number().int().positive().default(300_000),
  /**
   * What the end of the TTL does: `kill` destroys the sandbox; `pause` pauses it keeping memory
   * (its TTL is then suspended until it is resumed). @default 'kill'
   */
  onTimeout: z.enum(['kill', 'pause']).default('kill'),
  /**
   * A paused sandbox resumes by itself on the next call that acts inside it (a process, a file,
   * code, a port; E2B's envd traffic), as a resume call or an E2B `connect` would; its TTL then
   * runs again as after any resume. Without it, those calls are SANDBOX_NOT_RUNNING until it is
   * resumed. E2B's `lifecycle.autoResume`. @default false
   */
  autoResume: z.boolean().default(false),
});

export type SandboxSpecInput = z.input<typeof SandboxSpecSchema>;
export type SandboxSpec = z.output<typeof SandboxSpecSchema>;
export type Limits = z.output<typeof LimitsSchema>;
export type NetworkPolicy = z.output<typeof NetworkPolicySchema>;
export type NetworkPolicyInput = z.input<typeof NetworkPolicySchema>;
export type Mount = z.output<typeof MountSchema>;
export type VolumeMount = z.output<typeof VolumeMountSchema>;
export type BackendName = (typeof BACKENDS)[number];

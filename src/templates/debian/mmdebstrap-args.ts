import { SandboxError } from '../../errors/index.js';

/**
 * What every bootstrapped template holds besides the `apt` variant: the tools E2B's ready checks
 * call (`ss` from iproute2, `curl`, `pgrep` from procps) and CA certificates.
 */
export const DEFAULT_PACKAGES = ['ca-certificates', 'curl', 'iproute2', 'procps'] as const;

/** The template user: uid 1000 like a sandbox's user today, home /home/user. */
export const TEMPLATE_USER = { name: 'user', uid: 1000, home: '/home/user' } as const;

const PACKAGE = /^[a-z0-9][a-z0-9+.-]{0,99}(?:=[A-Za-z0-9.+~:-]{1,100})?$/;
const SUITE = /^[a-z][a-z0-9-]{1,31}$/;

export interface MmdebstrapInput {
  suite: string;
  /** Packages beyond the defaults. */
  packages: readonly string[];
  /** An empty directory (an empty subvolume) to write the root into. */
  target: string;
  /** apt source files (the host's, or rewritten for another suite), each passed as a MIRROR. */
  sources: readonly string[];
  /** Keyrings the sources name that the root would otherwise lack. */
  keyrings: readonly string[];
}

/** The packages as given plus the defaults, deduplicated, each checked. */
export function bootstrapPackages(packages: readonly string[]): string[] {
  for (const name of packages) {
    if (!PACKAGE.test(name)) {
      throw new SandboxError('INVALID_ARGUMENT', `"${name}" is not a Debian package name (lowercase letters, digits, "+", "-", "."; optionally =version)`, {
        details: { field: 'packages', value: name },
      });
    }
  }
  return [...new Set([...DEFAULT_PACKAGES, ...packages])];
}

export function checkSuite(suite: string): string {
  if (!SUITE.test(suite)) {
    throw new SandboxError('INVALID_ARGUMENT', `"${suite}" is not a Debian suite name (e.g. bookworm, trixie, stable)`, { details: { field: 'suite', value: suite } });
  }
  return suite;
}

/**
 * mmdebstrap's argv: root mode (so ownership on disk is raw 0..65535, R1 §1.2), the `apt` variant,
 * straight into the target (no tarball), the template user made in a customize hook, inside a
 * mount namespace of its own so its bind mounts of /dev, /proc, /sys cannot outlive it.
 * The bench runs the part from `mmdebstrap` on as the baseline.
 */
export function mmdebstrapArgv(input: MmdebstrapInput): string[] {
  const { name, uid, home } = TEMPLATE_USER;
  const keyHooks = input.keyrings.map((path) => {
    if (/\s/.test(path) || !path.startsWith('/')) throw new SandboxError('HOST_NOT_READY', `the apt keyring path "${path}" cannot be copied into a template`);
    const dir = path.slice(0, path.lastIndexOf('/')) || '/';
    return [`--customize-hook=mkdir -p "$1${dir}"`, `--customize-hook=copy-in ${path} ${dir}`];
  });
  return [
    '/usr/bin/mmdebstrap',
    '--mode=root',
    '--variant=apt',
    `--include=${bootstrapPackages(input.packages).join(',')}`,
    ...keyHooks.flat(),
    `--customize-hook=chroot "$1" useradd --create-home --home-dir ${home} --uid ${uid} --user-group --shell /bin/bash ${name}`,
    checkSuite(input.suite),
    input.target,
    ...input.sources,
  ];
}

/** The wrapper that gives mmdebstrap its own mount namespace. */
export const UNSHARE_MOUNT = ['/usr/bin/unshare', '--mount', '--propagation', 'private', '--'] as const;

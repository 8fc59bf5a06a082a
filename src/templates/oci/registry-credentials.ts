import { stat } from 'node:fs/promises';
import { join } from 'node:path';
import { SandboxError } from '../../errors/index.js';
import { withLock } from '../../host/lock.host.js';
import { readJson, writeJsonAtomic } from '../json-files.js';

interface AuthFile {
  auths: Record<string, { auth: string }>;
}

/**
 * Registry credentials the operator stores for Capsule, in containers' auth.json format at
 * `<dataDir>/registry-auth.json` (0600, root's). skopeo reads them from that file
 * (`--authfile`): never from argv, where every host user could read them in /proc, and never
 * from a tenant's request. Tenants pull with whatever the operator stored for the registry.
 */
export class RegistryCredentials {
  readonly path: string;

  constructor(dataDir: string) {
    this.path = join(dataDir, 'registry-auth.json');
  }

  async set(registry: string, username: string, password: string): Promise<void> {
    if (username.includes(':')) throw new SandboxError('INVALID_ARGUMENT', 'a registry user name cannot contain ":"', { details: { field: 'username' } });
    await withLock(`${this.path}.lock`, async () => {
      const file = (await readJson<AuthFile>(this.path)) ?? { auths: {} };
      file.auths[registry] = { auth: Buffer.from(`${username}:${password}`).toString('base64') };
      await writeJsonAtomic(this.path, file);
    });
  }

  async remove(registry: string): Promise<boolean> {
    return withLock(`${this.path}.lock`, async () => {
      const file = await readJson<AuthFile>(this.path);
      if (!file?.auths[registry]) return false;
      delete file.auths[registry];
      await writeJsonAtomic(this.path, file);
      return true;
    });
  }

  /** Registries with stored credentials (never the credentials themselves). */
  async registries(): Promise<string[]> {
    return Object.keys((await readJson<AuthFile>(this.path))?.auths ?? {}).sort();
  }

  /**
   * The auth file to hand skopeo when it holds credentials for `registry`; undefined otherwise.
   * A file that others could read or that root does not own is refused: it would not be the
   * operator's.
   */
  async authFileFor(registry: string): Promise<string | undefined> {
    if (!(await this.registries()).includes(registry)) return undefined;
    const info = await stat(this.path);
    if ((info.mode & 0o077) !== 0 || info.uid !== process.getuid?.()) {
      throw new SandboxError('HOST_NOT_READY', `${this.path} must be owned by root with mode 0600 (it is ${(info.mode & 0o777).toString(8)}, uid ${info.uid})`, {
        hint: `chmod 600 ${this.path}`,
      });
    }
    return this.path;
  }
}

import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir, readdir, rename, rm, stat, utimes } from 'node:fs/promises';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { SandboxError } from '../../errors/index.js';
import { TENANT_ID_PATTERN } from '../../wire/operators.js';
import { unpackContextTar } from '../../templates/index.js';
import { HASH } from './template-steps.js';

export interface TemplateFileLimits {
  /** Bytes of one upload (as sent, gzipped or not). @default 256 MiB */
  maxUploadBytes: number;
  /** Bytes of one tenant's stored uploads; the least recently used go first past it. @default 2 GiB */
  maxTenantBytes: number;
  /** Uploads one tenant keeps. @default 500 */
  maxTenantFiles: number;
  /** How long an upload URL is good for. @default 1 hour */
  urlTtlMs: number;
}

export const DEFAULT_TEMPLATE_FILE_LIMITS: TemplateFileLimits = { maxUploadBytes: 256 * 1024 ** 2, maxTenantBytes: 2 * 1024 ** 3, maxTenantFiles: 500, urlTtlMs: 60 * 60 * 1000 };

/** What a verified upload token allows: one file of one tenant, under the hash the SDK named. */
export interface UploadGrant {
  tenantId: string;
  hash: string;
}

/**
 * The files of E2B template builds: the tar the SDK uploads for each COPY step, stored per tenant
 * under the hash the SDK computed (`<dir>/<tenant>/<hash>`), so an unchanged COPY is not uploaded
 * again. The hash is the client's own and is not checked against the content: a tenant can only
 * ever mislabel files for itself, and a build reads only its own tenant's files.
 *
 * Upload URLs are signed (`…/<tenant>/<hash>?expires=…&signature=<hmac>`) by a secret of this
 * server: a URL names one tenant's one file, for an hour; it is the only credential the SDK's PUT
 * carries.
 */
export class TemplateFiles {
  private readonly secret: Buffer;
  readonly limits: TemplateFileLimits;
  private readonly now: () => number;

  constructor(
    private readonly dir: string,
    options: { secret?: Buffer; limits?: Partial<TemplateFileLimits>; now?: () => number } = {},
  ) {
    this.secret = options.secret ?? randomBytes(32);
    this.limits = { ...DEFAULT_TEMPLATE_FILE_LIMITS, ...(options.limits ?? {}) };
    this.now = options.now ?? Date.now;
  }

  private pathOf(tenantId: string, hash: string): string {
    if (!TENANT_ID_PATTERN.test(tenantId) || !HASH.test(hash)) throw new SandboxError('INVALID_ARGUMENT', `"${hash}" is not a files hash (64 hex digits)`, { details: { field: 'hash' } });
    return join(this.dir, tenantId, hash);
  }

  /** Whether the tenant has the file; a hit counts as a use (the store keeps the recently used). */
  async has(tenantId: string, hash: string): Promise<boolean> {
    const path = this.pathOf(tenantId, hash);
    try {
      const now = new Date(this.now());
      await utimes(path, now, now);
      return true;
    } catch {
      return false;
    }
  }

  /** The query of a signed upload URL for the grant: `expires` (seconds) and `signature`. */
  sign(grant: UploadGrant, nowMs: number): { expires: string; signature: string } {
    this.pathOf(grant.tenantId, grant.hash);
    const expiresSec = Math.floor((nowMs + this.limits.urlTtlMs) / 1000);
    return { expires: String(expiresSec), signature: this.mac(grant, expiresSec) };
  }

  /** The grant of a signed URL's parts, or UNAUTHENTICATED saying why not (pure but for the secret). */
  verify(parts: { tenantId: string; hash: string; expires?: string; signature?: string }, nowMs: number): UploadGrant {
    const { tenantId, hash, expires = '', signature = '' } = parts;
    const refuse = (why: string) =>
      new SandboxError('UNAUTHENTICATED', `the upload URL is ${why}`, { hint: 'Ask for a new one (GET /templates/{templateID}/files/{hash}); Template.build does so by itself.' });
    if (!/^\d{1,12}$/.test(expires) || !TENANT_ID_PATTERN.test(tenantId) || !HASH.test(hash)) throw refuse('malformed');
    const expected = Buffer.from(this.mac({ tenantId, hash }, Number(expires)));
    const given = Buffer.from(signature);
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) throw refuse('not signed by this server');
    if (Number(expires) * 1000 <= nowMs) throw refuse('expired');
    return { tenantId, hash };
  }

  private mac(grant: UploadGrant, expiresSec: number): string {
    return createHmac('sha256', this.secret).update(`capsule-e2b-template-file\0${grant.tenantId}\0${grant.hash}\0${expiresSec}`).digest('base64url');
  }

  /**
   * Stores an upload: written to a temp name and renamed, so a reader sees it whole or not at
   * all; past `maxUploadBytes` it stops with PAYLOAD_TOO_LARGE and keeps nothing. Then the
   * tenant's least recently used files go until the tenant is within its bounds.
   */
  async save(grant: UploadGrant, body: Readable, declaredBytes?: number): Promise<{ bytes: number }> {
    const path = this.pathOf(grant.tenantId, grant.hash);
    const max = this.limits.maxUploadBytes;
    const tooLarge = () =>
      new SandboxError('PAYLOAD_TOO_LARGE', `a template's files may be at most ${max} bytes in one upload`, {
        details: { limitBytes: max },
        hint: 'Copy less in one copy() step (split it, or leave files out with .dockerignore), or fetch big files in a RUN step.',
      });
    if (declaredBytes !== undefined && declaredBytes > max) throw tooLarge();
    await mkdir(join(this.dir, grant.tenantId), { recursive: true, mode: 0o700 });
    const temp = `${path}.${randomBytes(6).toString('hex')}.part`;
    let bytes = 0;
    try {
      await pipeline(
        body,
        async function* (source: AsyncIterable<Buffer>) {
          for await (const chunk of source) {
            bytes += chunk.length;
            if (bytes > max) throw tooLarge();
            yield chunk;
          }
        },
        createWriteStream(temp, { flags: 'wx', mode: 0o600 }),
      );
      const now = new Date(this.now());
      await utimes(temp, now, now);
      await rename(temp, path);
    } catch (error) {
      await rm(temp, { force: true });
      throw error;
    }
    await this.evict(grant.tenantId, grant.hash);
    return { bytes };
  }

  /** Unpacks the tenant's file into `dir` (a fresh directory of the caller's); FILE_NOT_FOUND if it is not there. */
  async unpack(tenantId: string, hash: string, dir: string): Promise<void> {
    const path = this.pathOf(tenantId, hash);
    if (!(await this.has(tenantId, hash))) {
      throw new SandboxError('FILE_NOT_FOUND', `the files of hash ${hash} were never uploaded (or were evicted)`, {
        details: { hash },
        hint: 'Build again: Template.build uploads what the server does not have.',
      });
    }
    await mkdir(dir, { recursive: true, mode: 0o700 });
    await unpackContextTar(createReadStream(path), dir);
  }

  /** Keeps a tenant within its bounds, the least recently used first; never the file just written. */
  private async evict(tenantId: string, keep: string): Promise<void> {
    const dir = join(this.dir, tenantId);
    const files = [];
    for (const name of await readdir(dir)) {
      if (!HASH.test(name)) continue;
      const info = await stat(join(dir, name)).catch(() => undefined);
      if (info) files.push({ name, bytes: info.size, used: info.mtimeMs });
    }
    files.sort((a, b) => a.used - b.used);
    let total = files.reduce((sum, f) => sum + f.bytes, 0);
    let count = files.length;
    for (const file of files) {
      if (total <= this.limits.maxTenantBytes && count <= this.limits.maxTenantFiles) break;
      if (file.name === keep) continue;
      await rm(join(dir, file.name), { force: true });
      total -= file.bytes;
      count--;
    }
  }
}

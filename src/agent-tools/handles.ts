import { Sandbox, type ConnectionOptions } from '../sdk/index.js';

/** Most sandbox handles kept between tool calls. @default 256 */
const MAX_HANDLES = 256;

/**
 * Connected sandboxes by API key and id, kept between tool calls: a call on a known sandbox
 * skips the lookup `Sandbox.connect` makes (a sandbox gone since is still an error from the call
 * itself). The key is part of the entry's name, so a handle never serves another credential.
 */
export class SandboxHandles {
  private readonly handles = new Map<string, Sandbox>();

  async get(id: unknown, connection: ConnectionOptions): Promise<Sandbox> {
    const known = this.handles.get(entryName(id, connection));
    if (known) return known;
    const sandbox = await Sandbox.connect(String(id), connection);
    this.remember(sandbox, connection);
    return sandbox;
  }

  /** Keeps a sandbox this process made (create, fork) so that the next call needs no lookup. */
  remember(sandbox: Sandbox, connection: ConnectionOptions): void {
    if (this.handles.size >= MAX_HANDLES) this.handles.delete(this.handles.keys().next().value ?? '');
    this.handles.set(entryName(sandbox.sandboxId, connection), sandbox);
  }

  forget(id: unknown, connection: ConnectionOptions): void {
    this.handles.delete(entryName(id, connection));
  }
}

function entryName(id: unknown, connection: ConnectionOptions): string {
  return `${connection.url ?? ''}\0${connection.apiKey ?? ''}\0${String(id)}`;
}

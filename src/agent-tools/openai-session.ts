import {
  Manifest,
  SandboxUnsupportedFeatureError,
  recordExposedPortEndpoint,
  type ExecCommandArgs,
  type ExposedPortEndpoint,
  type ListDirectoryArgs,
  type MaterializeEntryArgs,
  type ReadFileArgs,
  type SandboxDirectoryEntry,
  type SandboxExecResult,
  type SandboxSession,
  type SandboxSessionState,
  type ViewImageArgs,
  type WriteStdinArgs,
} from '@openai/agents/sandbox';
import type { Editor, ToolOutputImage } from '@openai/agents';
import type { CapsuleError, Sandbox, SnapshotInfo } from '../sdk/index.js';
import { CapsuleEditor, inRoot, viewImage } from './openai-editor.js';
import { DEFAULT_EXEC_YIELD_MS, DEFAULT_STDIN_YIELD_MS, renderTurn, startCommand, takeOutput, waitOrYield, type ExecTurn, type LiveCommand } from './openai-exec.js';

/** Commands one session keeps for write_stdin at once; past it the oldest ended one is dropped. @default 64 */
const MAX_LIVE_COMMANDS = 64;

/** What the Agents SDK keeps of a Capsule session (and serializes into a RunState). */
export interface CapsuleSandboxSessionState extends SandboxSessionState {
  /** The Capsule sandbox this session drives. */
  sandboxId: string;
}

function unsupported(what: string, hint: string): SandboxUnsupportedFeatureError {
  return new SandboxUnsupportedFeatureError(`Capsule sandbox sessions do not support ${what}. ${hint}`, { provider: 'capsule' });
}

/**
 * A sandbox session of the OpenAI Agents SDK on a Capsule sandbox: the SDK's shell and filesystem
 * capabilities (exec_command, write_stdin, apply_patch, view_image) run through Capsule's
 * TypeScript SDK. Capsule-only operations (snapshot, fork, changes) are methods here too.
 */
export class CapsuleSandboxSession implements SandboxSession<CapsuleSandboxSessionState> {
  private readonly live = new Map<number, LiveCommand>();
  private nextSessionId = 1;

  constructor(
    readonly sandbox: Sandbox,
    public state: CapsuleSandboxSessionState,
  ) {}

  get sandboxId(): string {
    return this.sandbox.sandboxId;
  }

  async running(): Promise<boolean> {
    return (await this.sandbox.getInfo()).state === 'running';
  }

  /** write_stdin is offered: commands keep stdin open (pipes; a PTY is not offered, see exec). */
  supportsPty(): boolean {
    return true;
  }

  createEditor(runAs?: string): Editor {
    this.refuseRunAs(runAs);
    return new CapsuleEditor(this.sandbox, this.state.manifest.root);
  }

  async execCommand(args: ExecCommandArgs): Promise<string> {
    return renderTurn(await this.exec(args));
  }

  async exec(args: ExecCommandArgs): Promise<SandboxExecResult> {
    this.refuseRunAs(args.runAs);
    if (args.tty === true) throw unsupported('a TTY (tty: true)', 'Run the command with tty: false; write_stdin still feeds its stdin, and "\\u0003" sends it SIGINT.');
    const started = Date.now();
    const argv = [args.shell ?? 'sh', args.login === false ? '-c' : '-lc', args.cmd];
    const live = await startCommand(this.sandbox, argv, { cwd: inRoot(this.state.manifest.root, args.workdir), env: this.state.environment ?? {} });
    await waitOrYield(live, args.yieldTimeMs ?? DEFAULT_EXEC_YIELD_MS);
    return this.turn(live, started, args.maxOutputTokens);
  }

  async writeStdin(args: WriteStdinArgs): Promise<string> {
    const live = this.live.get(args.sessionId);
    if (live === undefined) return renderTurn({ output: `write_stdin failed: no running command with session ID ${args.sessionId}`, stdout: '', stderr: '', wallTimeSeconds: 0, exitCode: 1 });
    const started = Date.now();
    const chars = args.chars ?? '';
    // Ctrl-C, as a terminal would send it: SIGINT to the command (stdin is a pipe, not a PTY).
    if (chars.includes('\u0003') && live.result === undefined) await live.handle.kill('SIGINT');
    const text = chars.replaceAll('\u0003', '');
    if (text !== '' && live.result === undefined) await live.handle.sendStdin(text);
    await waitOrYield(live, args.yieldTimeMs ?? DEFAULT_STDIN_YIELD_MS);
    const turn = this.turn(live, started, args.maxOutputTokens, args.sessionId);
    return renderTurn(turn);
  }

  async readFile(args: ReadFileArgs): Promise<Uint8Array> {
    this.refuseRunAs(args.runAs);
    const bytes = await this.sandbox.files.read(inRoot(this.state.manifest.root, args.path), { format: 'bytes' });
    return typeof args.maxBytes === 'number' && bytes.byteLength > args.maxBytes ? bytes.subarray(0, args.maxBytes) : bytes;
  }

  async listDir(args: ListDirectoryArgs): Promise<SandboxDirectoryEntry[]> {
    this.refuseRunAs(args.runAs);
    const entries = await this.sandbox.files.list(inRoot(this.state.manifest.root, args.path));
    return entries.map((entry) => ({ name: entry.name, path: entry.path, type: entry.type === 'file' || entry.type === 'dir' ? entry.type : 'other' }));
  }

  async pathExists(path: string, runAs?: string): Promise<boolean> {
    this.refuseRunAs(runAs);
    return this.sandbox.files.exists(inRoot(this.state.manifest.root, path));
  }

  async viewImage(args: ViewImageArgs): Promise<ToolOutputImage> {
    this.refuseRunAs(args.runAs);
    return viewImage(this.sandbox, inRoot(this.state.manifest.root, args.path));
  }

  /** Writes one manifest entry (a file, or a directory with its children) into the sandbox. */
  async materializeEntry(args: MaterializeEntryArgs): Promise<void> {
    this.refuseRunAs(args.runAs);
    await materialize(this.sandbox, new Manifest({ root: this.state.manifest.root, entries: { [args.path]: args.entry } }));
    this.state.manifest = new Manifest({ ...this.state.manifest, entries: { ...this.state.manifest.entries, [args.path]: args.entry } });
  }

  async applyManifest(manifest: Manifest, runAs?: string): Promise<void> {
    this.refuseRunAs(runAs);
    await materialize(this.sandbox, manifest);
    this.state.environment = { ...this.state.environment, ...(await manifest.resolveEnvironment()) };
    this.state.manifest = new Manifest({ ...this.state.manifest, entries: { ...this.state.manifest.entries, ...manifest.entries } });
  }

  /** A signed URL to `port` through the Capsule server (the sandbox needs no network for it). */
  async resolveExposedPort(port: number): Promise<ExposedPortEndpoint> {
    const signed = await this.sandbox.portUrl(port);
    const url = new URL(signed.hostUrl ?? signed.url);
    return recordExposedPortEndpoint(this.state, {
      host: url.hostname,
      port: Number(url.port || (url.protocol === 'https:' ? 443 : 80)),
      tls: url.protocol === 'https:',
      query: url.search.replace(/^\?/, ''),
      url: signed.hostUrl ?? signed.url,
    }, port);
  }

  /** A Capsule snapshot of the sandbox's files now; `CapsuleSandboxClient.create({ snapshot: { type: 'capsule', snapshotId } })` starts from it. */
  snapshot(options: { name?: string } = {}): Promise<SnapshotInfo> {
    return this.sandbox.snapshot(options);
  }

  /**
   * `count` new sessions, each on a fork of this sandbox (one snapshot, then a sandbox per fork),
   * with this session's manifest and environment. A fork that could not be made is in `errors`.
   */
  async fork(count = 1): Promise<{ snapshotId: string; sessions: CapsuleSandboxSession[]; errors: CapsuleError[] }> {
    const outcome = await this.sandbox.fork(count);
    const sessions: CapsuleSandboxSession[] = [];
    const errors: CapsuleError[] = [];
    for (const entry of outcome.forks) {
      if ('error' in entry) errors.push(entry.error);
      else sessions.push(new CapsuleSandboxSession(entry.sandbox, { ...this.state, sandboxId: entry.sandbox.sandboxId, exposedPorts: {} }));
    }
    return { snapshotId: outcome.snapshot.snapshotId, sessions, errors };
  }

  /** What changed against the sandbox's origin (or `since` a snapshot). */
  changes(options: { since?: string } = {}): ReturnType<Sandbox['changes']> {
    return this.sandbox.changes(options);
  }

  /** Kills the Capsule sandbox (the Agents SDK calls this when it cleans up a session it made). */
  async delete(): Promise<void> {
    this.forgetCommands();
    await this.sandbox.kill();
  }

  /** Lets go of the session's commands without ending the sandbox. */
  close(): Promise<void> {
    this.forgetCommands();
    return Promise.resolve();
  }

  private turn(live: LiveCommand, started: number, maxOutputTokens: number | undefined, sessionId?: number): ExecTurn {
    const { output, originalTokenCount } = takeOutput(live, maxOutputTokens);
    const base = { output, stdout: live.stdout, stderr: live.stderr, wallTimeSeconds: (Date.now() - started) / 1000, ...(originalTokenCount !== undefined && { originalTokenCount }) };
    if (live.result !== undefined) {
      if (sessionId !== undefined) this.live.delete(sessionId);
      return { ...base, exitCode: live.result.exitCode };
    }
    const id = sessionId ?? this.keep(live);
    return { ...base, sessionId: id };
  }

  private keep(live: LiveCommand): number {
    if (this.live.size >= MAX_LIVE_COMMANDS) {
      const [oldest] = [...this.live.entries()].find(([, command]) => command.result !== undefined) ?? [...this.live.entries()][0]!;
      this.live.get(oldest)?.handle.disconnect();
      this.live.delete(oldest);
    }
    const id = this.nextSessionId++;
    this.live.set(id, live);
    return id;
  }

  private forgetCommands(): void {
    for (const live of this.live.values()) live.handle.disconnect();
    this.live.clear();
  }

  private refuseRunAs(runAs: string | undefined): void {
    if (runAs !== undefined) throw unsupported(`running as another user (runAs: ${runAs})`, 'Leave the agent\'s runAs unset: commands run as the sandbox template\'s user.');
  }
}

/** Writes a manifest's files and directories; other entry types are refused by name, never skipped. */
export async function materialize(sandbox: Sandbox, manifest: Manifest): Promise<void> {
  if (manifest.users.length > 0 || manifest.groups.length > 0) throw unsupported('manifest users and groups', 'Remove them: a Capsule sandbox runs as its template\'s user.');
  for (const { absolutePath, entry } of manifest.iterEntries()) {
    if (entry.permissions !== undefined || entry.group !== undefined) throw unsupported(`permissions or groups on manifest entries (${absolutePath})`, 'Set modes with a command (chmod) after the sandbox starts.');
    if (entry.type === 'file') await sandbox.files.write(absolutePath, entry.content);
    else if (entry.type === 'dir') await sandbox.files.makeDir(absolutePath);
    else throw unsupported(`manifest entries of type ${entry.type} (${absolutePath})`, 'Use file and dir entries, or fetch the data with a command inside the sandbox.');
  }
}

/**
 * Host side of the agent's TCP relays (native/agent-relay.h): a connection to a port on the
 * sandbox's own loopback, as a Node Duplex that node:http can use as its socket. Each side sends
 * at most RELAY_WINDOW_BYTES the other has not acknowledged: a slow HTTP client stalls its relay
 * (the agent stops reading that socket), never the agent or the other relays.
 */
import { Duplex } from 'node:stream';
import { constants as osConstants } from 'node:os';
import { SandboxError } from '../../errors/index.js';
import { FrameType, RELAY_WINDOW_BYTES, decodeRelayClosed, decodeRelayOpened, decodeU32, encodeRelayOpen, encodeU32, type Frame } from './protocol.js';

/** Largest data frame; also the read side's high-water mark. */
const CHUNK_BYTES = 64 * 1024;
const HALF_WINDOW = RELAY_WINDOW_BYTES / 2;
/** The agent answers a connect to its own loopback at once; a frozen sandbox would not. @default */
export const RELAY_CONNECT_TIMEOUT_MS = 10_000;

type Send = (type: number, id: number, payload?: Buffer) => void;

const errnoNames = new Map<number, string>(Object.entries(osConstants.errno).map(([name, number]) => [number, name]));

/** A TCP connection to a port inside the sandbox, carried by the agent. */
export class AgentRelay extends Duplex {
  /** Bytes this side may still send before the agent acknowledges some. */
  private window = RELAY_WINDOW_BYTES;
  private stalled: { chunk: Buffer; callback: (error?: Error | null) => void } | undefined;
  /** Bytes received and not yet acknowledged: the agent's credit is the window minus these. */
  private unacknowledged = 0;
  private localEnded = false;
  private remoteEnded = false;
  /**
   * What reached this relay before its owner could have listened: the agent's answer to the
   * connect and the server's reset can arrive in one read, and a stream destroyed with an error
   * nobody listens to yet throws (and a later `close` listener never fires). Held until
   * `release()`, one event-loop turn after the connect resolved, which is what a net.Socket
   * guarantees: no event in the turn that handed it out.
   */
  private held: (() => void)[] | null = [];

  constructor(
    readonly relayId: number,
    readonly port: number,
    private readonly send: Send,
    private readonly onDone: (relay: AgentRelay) => void,
  ) {
    super({ allowHalfOpen: true, readableHighWaterMark: CHUNK_BYTES, writableHighWaterMark: CHUNK_BYTES });
  }

  // What node:http's client and agent call on a socket; a relay has no TCP options of its own.
  setNoDelay(): this {
    return this;
  }

  setKeepAlive(): this {
    return this;
  }

  /** The idle timeout in ms, as net.Socket has it (node:http's agent reads it); 0 is none. */
  timeout = 0;
  private idleTimer: NodeJS.Timeout | undefined;

  /** Emits 'timeout' once `ms` pass with no byte either way (net.Socket's idle timeout); 0 disables it. */
  setTimeout(ms: number, callback?: () => void): this {
    if (callback) {
      if (ms === 0) this.removeListener('timeout', callback);
      else this.once('timeout', callback);
    }
    this.timeout = ms;
    this.touch();
    return this;
  }

  ref(): this {
    return this;
  }

  unref(): this {
    return this;
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    this.touch();
    this.sendData(chunk, callback);
  }

  override _final(callback: (error?: Error | null) => void): void {
    this.localEnded = true;
    this.send(FrameType.RelayClose, this.relayId, Buffer.from([1]));
    this.settleIfDone();
    callback();
  }

  override _read(): void {
    this.acknowledge();
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    clearTimeout(this.idleTimer);
    if (!(this.localEnded && this.remoteEnded)) this.send(FrameType.RelayClose, this.relayId, Buffer.from([0]));
    this.localEnded = this.remoteEnded = true;
    const stalled = this.stalled;
    this.stalled = undefined;
    this.onDone(this);
    stalled?.callback(error ?? new Error('relay closed'));
    callback(error);
  }

  /** Delivers what was held; from now on frames and losses act at once. */
  release(): void {
    const held = this.held ?? [];
    this.held = null;
    for (const deliver of held) deliver();
  }

  /** The agent is gone (or the table closed): the relay ends with `reason`. */
  lose(reason: Error | undefined): void {
    if (this.held !== null) this.held.push(() => this.destroy(reason));
    else this.destroy(reason);
  }

  /** A frame of this relay from the agent. */
  receive(frame: Frame): void {
    if (this.held !== null) {
      this.held.push(() => this.receive(frame));
      return;
    }
    if (this.destroyed) return;
    switch (frame.type) {
      case FrameType.RelayFromAgent:
        this.touch();
        this.unacknowledged += frame.payload.length;
        if (this.push(frame.payload)) this.acknowledge();
        return;
      case FrameType.RelayAck: {
        this.window += decodeU32(frame.payload, 'RELAY_ACK');
        const stalled = this.stalled;
        this.stalled = undefined;
        if (stalled) this.sendData(stalled.chunk, stalled.callback);
        return;
      }
      case FrameType.RelayClosed: {
        const closed = decodeRelayClosed(frame.payload);
        if (closed.eof) {
          this.remoteEnded = true;
          this.push(null);
          this.settleIfDone();
          return;
        }
        this.remoteEnded = true;
        const name = errnoNames.get(closed.errno) ?? 'ECONNRESET';
        this.destroy(Object.assign(new Error(`connection to port ${this.port} in the sandbox ended: ${name}`), { code: name }));
        return;
      }
      default:
        return;
    }
  }

  private sendData(chunk: Buffer, callback: (error?: Error | null) => void): void {
    let rest = chunk;
    while (rest.length > 0 && this.window > 0) {
      const n = Math.min(rest.length, this.window, CHUNK_BYTES);
      this.send(FrameType.RelayData, this.relayId, rest.subarray(0, n));
      this.window -= n;
      rest = rest.subarray(n);
    }
    if (rest.length > 0) this.stalled = { chunk: rest, callback };
    else callback();
  }

  /** Restarts the idle timer (activity either way); the timer never keeps the process alive. */
  private touch(): void {
    clearTimeout(this.idleTimer);
    if (this.timeout <= 0 || this.destroyed) return;
    this.idleTimer = setTimeout(() => this.emit('timeout'), this.timeout);
    this.idleTimer.unref();
  }

  /** Gives the agent credit for what the reader took, in steps of half a window. */
  private acknowledge(): void {
    if (this.unacknowledged < HALF_WINDOW || this.remoteEnded) return;
    this.send(FrameType.RelayWindow, this.relayId, encodeU32(this.unacknowledged));
    this.unacknowledged = 0;
  }

  private settleIfDone(): void {
    if (this.localEnded && this.remoteEnded) this.onDone(this);
  }
}

interface Opening {
  relay: AgentRelay;
  resolve: (relay: AgentRelay) => void;
  reject: (error: SandboxError) => void;
  timer: NodeJS.Timeout;
  cleanup: () => void;
}

/** The relays of one agent client: opening, routing frames by id, ending them with the agent. */
export class RelayTable {
  private readonly opening = new Map<number, Opening>();
  private readonly open = new Map<number, AgentRelay>();
  private nextId = 1;

  constructor(private readonly send: Send) {}

  get size(): number {
    return this.open.size + this.opening.size;
  }

  /** Connects to `port` on the sandbox's loopback (127.0.0.1, then ::1). */
  connect(port: number, options: { signal?: AbortSignal; timeoutMs?: number } = {}): Promise<AgentRelay> {
    const payload = encodeRelayOpen(port);
    return new Promise<AgentRelay>((resolve, reject) => {
      const id = this.nextId++;
      const relay = new AgentRelay(id, port, this.send, (done) => {
        if (this.open.get(done.relayId) === done) this.open.delete(done.relayId);
      });
      const timeoutMs = options.timeoutMs ?? RELAY_CONNECT_TIMEOUT_MS;
      const fail = (error: SandboxError) => {
        const opening = this.opening.get(id);
        if (!opening) return;
        this.opening.delete(id);
        opening.cleanup();
        // The agent may still connect: its relay is closed as soon as it is known.
        this.send(FrameType.RelayClose, id, Buffer.from([0]));
        reject(error);
      };
      const onAbort = () => fail(new SandboxError('ABORTED', `connecting to port ${port} was cancelled`));
      const timer = setTimeout(
        () => fail(new SandboxError('TIMEOUT', `the sandbox did not answer a connection to port ${port} within ${timeoutMs} ms`, { details: { port, timeoutMs }, hint: 'Check that the sandbox is running and not paused.' })),
        timeoutMs,
      );
      options.signal?.addEventListener('abort', onAbort, { once: true });
      const cleanup = () => {
        clearTimeout(timer);
        options.signal?.removeEventListener('abort', onAbort);
      };
      if (options.signal?.aborted) {
        cleanup();
        reject(new SandboxError('ABORTED', `connecting to port ${port} was cancelled`));
        return;
      }
      this.opening.set(id, { relay, resolve, reject, timer, cleanup });
      this.send(FrameType.RelayOpen, id, payload);
    });
  }

  /** Routes a relay frame from the agent; frames of relays this table no longer has are dropped. */
  dispatch(frame: Frame): void {
    if (frame.type === FrameType.RelayOpened) {
      const opening = this.opening.get(frame.id);
      if (!opening) return;
      this.opening.delete(frame.id);
      opening.cleanup();
      const { errno, message } = decodeRelayOpened(frame.payload);
      if (errno === 0) {
        const relay = opening.relay;
        this.open.set(frame.id, relay);
        opening.resolve(relay);
        // The caller's continuation runs in this turn's microtasks; the relay's events start after.
        setImmediate(() => relay.release());
      } else {
        opening.reject(connectError(opening.relay.port, errno, message));
      }
      return;
    }
    this.open.get(frame.id)?.receive(frame);
  }

  /** The agent is gone: every relay ends, with `reason` unless the host closed the agent. */
  lose(reason: SandboxError | undefined): void {
    for (const opening of this.opening.values()) {
      opening.cleanup();
      opening.reject(reason ?? new SandboxError('SANDBOX_NOT_RUNNING', 'the agent client is closed'));
    }
    this.opening.clear();
    const open = [...this.open.values()];
    this.open.clear();
    for (const relay of open) relay.lose(reason);
  }
}

function connectError(port: number, errno: number, message: string): SandboxError {
  if (errnoNames.get(errno) === 'EMFILE') {
    return new SandboxError('LIMIT_EXCEEDED', `too many open connections into the sandbox (the agent relays at most 256 at once)`, {
      details: { port, resource: 'relays' },
      hint: 'Close idle connections to the sandbox\'s ports, or retry when fewer are open.',
    });
  }
  return new SandboxError('PORT_NOT_LISTENING', `nothing accepts connections on port ${port} inside the sandbox (${message || errnoNames.get(errno) || errno})`, {
    details: { port, errno: errnoNames.get(errno) ?? errno },
    hint: `Start a server in the sandbox listening on port ${port} (on 0.0.0.0, 127.0.0.1 or ::1), e.g. python3 -m http.server ${port}, then retry.`,
  });
}

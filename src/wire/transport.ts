import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import type { Readable } from 'node:stream';

/** A request body: replayable when it is bytes or a string; a stream is sent once, as it is read. */
export type RequestBody = Uint8Array | string | AsyncIterable<Uint8Array>;

/** One request as a transport carries it: the path with its query, the headers the SDK set, the body. */
export interface TransportRequest {
  method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  /** The server's origin as the SDK was given it (`url`'s scheme, host and port). */
  origin: string;
  path: string;
  headers: OutgoingHttpHeaders;
  body: RequestBody | undefined;
  /** Aborted when the call is cancelled (the caller's signal, its deadline). */
  signal: AbortSignal;
}

/**
 * A reply as the SDK reads it: its status and headers, its body as a byte stream; `complete`
 * once the whole body arrived. Node's `IncomingMessage` is one.
 */
export type TransportReply = Readable & { statusCode?: number; headers: IncomingHttpHeaders; complete: boolean };

/**
 * What carries the SDK's calls when it is not HTTP to the server's URL: the server gives its
 * own tools one that answers in its process (src/server/in-process.ts). Here in the wire
 * contract because both sides implement it: the SDK sends on it, the server answers. Not in the
 * wire's index: it names Node's stream types, and the web console compiles the index for the browser.
 */
export interface Transport {
  /** Resolves once the reply's headers are there; a reply other than 2xx is read as an error by the SDK. */
  send(request: TransportRequest): Promise<TransportReply>;
}

import { getEventListeners } from 'node:events';
import { Readable } from 'node:stream';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { SeamCalls } from '../../src/server/in-process.js';
import { defineRoute, type SeamServices } from '../../src/server/route.js';
import type { TransportRequest } from '../../src/wire/transport.js';

/**
 * The in-process transport's own duties (decision 024), on routes of the test's: a call ends on
 * the server when its caller stops reading, cancels, or the server closes, and a streamed body
 * is ended with the call. These routes need no key, audit or idempotency, so the stores the seam
 * would use for them are never reached. The real routes, tenants and audit:
 * test/e2e/in-process-calls.test.ts.
 */
/** Fastify's own logger when logging is off: what the server hands the transport, silent. */
const LOG = Fastify({ logger: false }).log;

function seam(): { calls: SeamCalls; services: SeamServices; close: AbortController } {
  const close = new AbortController();
  const unused = new Proxy({}, { get: () => { throw new Error('not used by these routes'); } });
  const services = { keys: unused, operations: unused, audit: unused, closeSignal: close.signal, atomically: <T>(fn: () => T) => fn() } as unknown as SeamServices;
  return { calls: new SeamCalls(), services, close };
}

function request(path: string, options: Partial<TransportRequest> = {}): TransportRequest {
  return { method: 'GET', origin: 'http://127.0.0.1:1', path, headers: {}, body: undefined, signal: new AbortController().signal, ...options };
}

/** Resolves when `signal` aborts. */
function abortOf(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => (signal.aborted ? resolve() : signal.addEventListener('abort', () => resolve(), { once: true })));
}

async function until(check: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 2000 && !check(); i++) await new Promise((resolve) => setTimeout(resolve, 5));
  expect(check(), what).toBe(true);
}

/** A quiet NDJSON stream: one event, then nothing until its call's signal aborts. */
function quietRoute(seen: { signal?: AbortSignal }) {
  return defineRoute({
    name: 'test.quiet',
    method: 'GET',
    url: '/v1/quiet',
    summary: 'one event, then quiet',
    auth: 'none',
    handler({ signal }) {
      seen.signal = signal;
      async function* events(): AsyncGenerator<object> {
        yield { type: 'start' };
        await abortOf(signal);
      }
      return { kind: 'ndjson', status: 200, events: events() };
    },
  });
}

describe('calls made in-process', () => {
  it('end on the server when the caller stops reading a quiet stream, and let go of the close signal', async () => {
    const { calls, services, close } = seam();
    const seen: { signal?: AbortSignal } = {};
    calls.add(quietRoute(seen), services);
    const before = getEventListeners(close.signal, 'abort').length;
    const reply = await calls.transport(LOG).send(request('/v1/quiet'));
    expect(reply.statusCode).toBe(200);
    const first: unknown = await new Promise((resolve) => reply.once('data', resolve));
    expect(JSON.parse(String(first))).toEqual({ type: 'start' });
    expect(getEventListeners(close.signal, 'abort').length).toBeGreaterThan(before);
    reply.destroy();
    await abortOf(seen.signal!);
    expect(getEventListeners(close.signal, 'abort').length).toBe(before);
  });

  it('end when the caller cancels, or when the server closes', async () => {
    for (const how of ['cancel', 'close'] as const) {
      const { calls, services, close } = seam();
      const seen: { signal?: AbortSignal } = {};
      calls.add(quietRoute(seen), services);
      const cancel = new AbortController();
      const reply = await calls.transport(LOG).send(request('/v1/quiet', { signal: cancel.signal }));
      reply.resume();
      if (how === 'cancel') cancel.abort();
      else close.abort();
      await abortOf(seen.signal!);
      await new Promise((resolve) => reply.once('end', resolve));
    }
  });

  it('end a streamed body the route gave up on, with the caller\'s source', async () => {
    const { calls, services } = seam();
    calls.add(
      defineRoute({
        name: 'test.upload',
        method: 'POST',
        url: '/v1/upload',
        summary: 'gives up after 4 KiB, as a write over its limit does',
        auth: 'none',
        rawBody: true,
        async handler({ body }) {
          let bytes = 0;
          for await (const chunk of body as Readable) {
            bytes += (chunk as Buffer).length;
            if (bytes > 4096) throw new Error('more than 4 KiB');
          }
          return { kind: 'empty', status: 204 };
        },
      }),
      services,
    );
    let sourceEnded = false;
    async function* endless(): AsyncGenerator<Uint8Array> {
      try {
        for (;;) {
          yield new Uint8Array(1024);
          await new Promise((resolve) => setImmediate(resolve));
        }
      } finally {
        sourceEnded = true;
      }
    }
    const reply = await calls
      .transport(LOG)
      .send(request('/v1/upload', { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: endless() }));
    expect(reply.statusCode).toBe(500);
    await until(() => sourceEnded, 'the source generator was ended');
  });

  it('answer a path it does not keep with NOT_FOUND, and an error with its request id', async () => {
    const { calls } = seam();
    const reply = await calls.transport(LOG).send(request('/mcp'));
    expect(reply.statusCode).toBe(404);
    const body = JSON.parse(Buffer.concat(await Readable.from(reply).toArray()).toString()) as { code: string; requestId: string };
    expect(body).toMatchObject({ code: 'NOT_FOUND' });
    expect(reply.headers['x-request-id']).toBe(body.requestId);
  });
});

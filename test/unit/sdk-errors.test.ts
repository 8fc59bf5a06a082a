import { describe, expect, it } from 'vitest';
import { ERROR_CODES, isSandboxError } from '../../src/errors/index.js';
import {
  CapsuleError,
  ERROR_CLASSES,
  FileNotFoundError,
  LimitExceededError,
  NotFoundError,
  QuotaExceededError,
  AuthenticationError,
  errorFromResponse,
  resolveConfig,
} from '../../src/sdk/index.js';
import { readNdjson } from '../../src/sdk/ndjson.js';

describe('SDK error classes', () => {
  it('has a class for every wire code, each a CapsuleError and a SandboxError', () => {
    for (const code of ERROR_CODES) {
      const error = errorFromResponse(400, { code, message: 'm' });
      expect(error, code).toBeInstanceOf(ERROR_CLASSES[code]);
      expect(error, code).toBeInstanceOf(CapsuleError);
      expect(isSandboxError(error, code)).toBe(true);
    }
  });

  it('maps the codes users catch to the classes they expect', () => {
    const of = (code: string, status: number) => errorFromResponse(status, { code, message: 'm', requestId: 'r1' });
    expect(of('FILE_NOT_FOUND', 404)).toBeInstanceOf(FileNotFoundError);
    expect(of('FILE_NOT_FOUND', 404)).toBeInstanceOf(NotFoundError);
    expect(of('LIMIT_EXCEEDED', 422)).toBeInstanceOf(LimitExceededError);
    expect(of('NO_SPACE', 507)).toBeInstanceOf(LimitExceededError);
    expect(of('QUOTA_EXCEEDED', 429)).toBeInstanceOf(QuotaExceededError);
    expect(of('UNAUTHENTICATED', 401)).toBeInstanceOf(AuthenticationError);
    expect(of('UNAUTHENTICATED', 401).name).toBe('AuthenticationError');
    expect(of('UNAUTHENTICATED', 401).toJSON()).toEqual({ code: 'UNAUTHENTICATED', message: 'm', requestId: 'r1' });
  });

  it('guesses the code from the status when the body is not an error body', () => {
    expect(errorFromResponse(401, '<html>').code).toBe('UNAUTHENTICATED');
    expect(errorFromResponse(502, undefined, 'req-9')).toMatchObject({ code: 'BACKEND_UNAVAILABLE', requestId: 'req-9' });
    expect(errorFromResponse(500, { message: 'no code' }).code).toBe('INTERNAL');
  });
});

describe('SDK configuration', () => {
  it('prefers options, then CAPSULE_URL / CAPSULE_API_KEY, then defaults', () => {
    expect(resolveConfig({}, {})).toEqual({ url: 'http://127.0.0.1:7070', apiKey: undefined, timeoutMs: 60_000 });
    expect(resolveConfig({}, { CAPSULE_URL: 'http://h:1/', CAPSULE_API_KEY: 'k' })).toEqual({ url: 'http://h:1', apiKey: 'k', timeoutMs: 60_000 });
    expect(resolveConfig({ url: 'http://o:2', apiKey: 'o', timeoutMs: 5 }, { CAPSULE_URL: 'http://h:1', CAPSULE_API_KEY: 'k' })).toEqual({
      url: 'http://o:2',
      apiKey: 'o',
      timeoutMs: 5,
    });
  });
});

describe('NDJSON reader', () => {
  it('reads objects split across chunks, multibyte characters split too, and a last line without newline', async () => {
    const text = '{"a":"é"}\n\n{"b":2}\n{"c":3}';
    const bytes = new TextEncoder().encode(text);
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        for (let i = 0; i < bytes.length; i += 3) controller.enqueue(bytes.subarray(i, i + 3));
        controller.close();
      },
    });
    const out: unknown[] = [];
    for await (const value of readNdjson(body)) out.push(value);
    expect(out).toEqual([{ a: 'é' }, { b: 2 }, { c: 3 }]);
  });

  it('reads Node Buffer chunks split at every byte, CRLF lines and blank lines included', async () => {
    const text = '{"a":"日本"}\r\n\n  \n{"b":[1,2]}\n{"c":"é"}';
    const bytes = Buffer.from(text);
    for (let cut = 0; cut <= bytes.length; cut++) {
      async function* chunks() {
        yield await Promise.resolve(bytes.subarray(0, cut));
        yield bytes.subarray(cut);
      }
      const out: unknown[] = [];
      for await (const value of readNdjson(chunks())) out.push(value);
      expect(out, `cut at ${cut}`).toEqual([{ a: '日本' }, { b: [1, 2] }, { c: 'é' }]);
    }
  });

  it('fails on a line that is not JSON', async () => {
    async function* chunks() {
      yield await Promise.resolve(Buffer.from('{"ok":1}\nnot json\n'));
    }
    const out: unknown[] = [];
    await expect(async () => {
      for await (const value of readNdjson(chunks())) out.push(value);
    }).rejects.toThrow(SyntaxError);
    expect(out).toEqual([{ ok: 1 }]);
  });

  it('cancels the body when the loop stops early', async () => {
    let cancelled = false;
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        controller.enqueue(new TextEncoder().encode('{"x":1}\n'));
      },
      cancel() {
        cancelled = true;
      },
    });
    for await (const value of readNdjson(body)) {
      expect(value).toEqual({ x: 1 });
      break;
    }
    expect(cancelled).toBe(true);
  });
});

/**
 * `promise`, or undefined as soon as `signal` aborts. The abort listener is removed when the
 * promise settles, so a long-lived signal (a server's close) holds nothing of a promise that has
 * already ended; `Promise.race` against a pending promise would keep every loser's reaction.
 */
export function untilAborted<T>(promise: Promise<T>, signal: AbortSignal | undefined): Promise<T | undefined> {
  if (!signal) return promise;
  if (signal.aborted) {
    promise.catch(() => undefined); // not awaited now: a later rejection is no unhandled one
    return Promise.resolve(undefined);
  }
  return new Promise<T | undefined>((resolve, reject) => {
    const onAbort = (): void => resolve(undefined);
    signal.addEventListener('abort', onAbort, { once: true });
    promise.finally(() => signal.removeEventListener('abort', onAbort)).then(resolve, reject);
  });
}

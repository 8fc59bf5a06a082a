/**
 * A signal that aborts when either of two does, and lets go of both once `release()` is called.
 * Not `AbortSignal.any`: on Node 20 every `any()` over a long-lived signal (the server's close
 * signal) leaves a WeakRef among that signal's dependants for good. Per request that was three
 * per sandbox created, used and killed (the soak's heap, issue 16).
 */
export function linkedSignal(first: AbortSignal, second: AbortSignal): { signal: AbortSignal; release: () => void } {
  const controller = new AbortController();
  const release = (): void => {
    first.removeEventListener('abort', onFirst);
    second.removeEventListener('abort', onSecond);
  };
  const onFirst = (): void => {
    release();
    controller.abort(first.reason);
  };
  const onSecond = (): void => {
    release();
    controller.abort(second.reason);
  };
  if (first.aborted) controller.abort(first.reason);
  else if (second.aborted) controller.abort(second.reason);
  else {
    first.addEventListener('abort', onFirst, { once: true });
    second.addEventListener('abort', onSecond, { once: true });
  }
  return { signal: controller.signal, release };
}

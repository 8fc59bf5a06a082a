import type { FunctionComponent } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { ErrorBox } from './error-box.js';

/**
 * A component loaded on first use: xterm.js and uPlot are most of the console's weight, and the
 * sandbox list needs neither.
 */
export function lazy<P extends object>(load: () => Promise<FunctionComponent<P>>): FunctionComponent<P> {
  let loaded: FunctionComponent<P> | undefined;
  return function Lazy(props: P) {
    const [component, setComponent] = useState<FunctionComponent<P> | undefined>(() => loaded);
    const [error, setError] = useState<unknown>();
    useEffect(() => {
      if (component) return;
      load()
        .then((c) => {
          loaded = c;
          setComponent(() => c);
        })
        .catch(setError);
    }, []);
    if (error) return <ErrorBox error={error} />;
    const Component = component;
    return Component ? <Component {...props} /> : <p class="muted">Loading…</p>;
  };
}

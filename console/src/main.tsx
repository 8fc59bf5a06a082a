import { render } from 'preact';
import type { ComponentChildren } from 'preact';
import { useEffect, useErrorBoundary, useState } from 'preact/hooks';
import { onSignedOut } from './api.js';
import { ErrorBox } from './components/error-box.js';
import { loadFeatures } from './features.js';
import { AuditPage } from './pages/audit.js';
import { lazy } from './components/lazy.js';
import { SandboxPage } from './pages/sandbox.js';
import { SandboxesPage } from './pages/sandboxes.js';
import { SignIn } from './pages/sign-in.js';
import { useRoute } from './router.js';
import { forget, loadSession, signInWithToken, signOut, type ConsoleSession } from './session.js';
import './styles.css';

const MetricsPage = lazy(() => import('./pages/metrics.js').then((m) => m.MetricsPage));

/** The login token of `capsule serve`'s console URL, taken out of the address bar at once. */
function takeLoginToken(): string | undefined {
  const match = /^#login=([A-Za-z0-9_]+)$/.exec(location.hash);
  if (!match) return undefined;
  history.replaceState(null, '', `${location.pathname}#/sandboxes`);
  return match[1];
}

function App() {
  const [session, setSession] = useState<ConsoleSession | undefined>(() => loadSession());
  const [signInError, setSignInError] = useState<unknown>();
  const [token] = useState(takeLoginToken);
  const [pending, setPending] = useState(token !== undefined);
  const [features, setFeatures] = useState<Set<string>>(new Set());
  const route = useRoute();
  useEffect(() => {
    void loadFeatures().then(setFeatures);
    const off = onSignedOut(() => {
      forget();
      setSession(undefined);
      setSignInError({ code: 'UNAUTHENTICATED', message: 'the session ended (it expired, was ended, or the server restarted)', hint: 'Sign in again.' });
    });
    if (token) {
      signInWithToken(token)
        .then(setSession)
        .catch(setSignInError)
        .finally(() => setPending(false));
    }
    return () => void off();
  }, []);
  if (pending) return <p class="muted center">Signing in…</p>;
  if (!session) return <SignIn reason={signInError} onSignedIn={setSession} />;
  const nav = [
    ['sandboxes', 'Sandboxes'],
    ['metrics', 'Metrics'],
    ['audit', 'Audit'],
  ] as const;
  return (
    <>
      <header class="top">
        <strong>Capsule</strong>
        <nav>
          {nav.map(([page, label]) => (
            <a key={page} href={`#/${page}`} class={route.page === page || (page === 'sandboxes' && route.page === 'sandbox') ? 'active' : ''} data-nav={page}>
              {label}
            </a>
          ))}
        </nav>
        <span class="grow" />
        <span data-testid="whoami">
          tenant <strong>{session.tenantId}</strong>
          {session.admin ? ' · operator' : ''}
        </span>
        <button
          class="small"
          onClick={() =>
            void signOut().finally(() => {
              setSession(undefined);
              setSignInError(undefined);
            })
          }
        >
          Sign out
        </button>
      </header>
      <main class="content">
        {route.page === 'sandboxes' && <SandboxesPage session={session} features={features} />}
        {route.page === 'sandbox' && route.sandboxId && <SandboxPage session={session} features={features} sandboxId={route.sandboxId} tab={route.tab ?? 'overview'} tenant={route.tenant} />}
        {route.page === 'metrics' && <MetricsPage key="metrics" />}
        {route.page === 'audit' && <AuditPage />}
      </main>
    </>
  );
}

/** A page that fails to render shows why, with a way back, instead of a blank page. */
function Boundary({ children }: { children: ComponentChildren }) {
  const [error, reset] = useErrorBoundary() as [unknown, () => void];
  if (!error) return <>{children}</>;
  return (
    <main class="content">
      <ErrorBox error={error} />
      <button onClick={reset}>Try again</button>
    </main>
  );
}

/** Whatever fails outside rendering (a stray promise) is shown too. */
function Root() {
  const [failure, setFailure] = useState<unknown>();
  useEffect(() => {
    const onError = (event: ErrorEvent) => setFailure(event.error ?? event.message);
    const onRejection = (event: PromiseRejectionEvent) => setFailure(event.reason);
    addEventListener('error', onError);
    addEventListener('unhandledrejection', onRejection);
    return () => {
      removeEventListener('error', onError);
      removeEventListener('unhandledrejection', onRejection);
    };
  }, []);
  return (
    <>
      {failure !== undefined && (
        <div class="global-error">
          <ErrorBox error={failure} onDismiss={() => setFailure(undefined)} />
        </div>
      )}
      <Boundary>
        <App />
      </Boundary>
    </>
  );
}

render(<Root />, document.getElementById('app')!);

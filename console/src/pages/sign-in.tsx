import { useState } from 'preact/hooks';
import { ErrorBox } from '../components/error-box.js';
import { signInWithKey, type ConsoleSession } from '../session.js';

/** Sign in with an API key: it is exchanged for a session key at once and not kept. */
export function SignIn({ onSignedIn, reason }: { onSignedIn: (session: ConsoleSession) => void; reason: unknown }) {
  const [key, setKey] = useState('');
  const [error, setError] = useState<unknown>(reason);
  const [busy, setBusy] = useState(false);
  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    try {
      onSignedIn(await signInWithKey(key));
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
      setKey('');
    }
  };
  return (
    <main class="sign-in">
      <form class="card" onSubmit={(e) => void submit(e)} data-testid="sign-in">
        <h1>Capsule</h1>
        <p>Sign in with an API key. The console exchanges it for a session key that lasts 8 hours in this tab only; the key itself is not stored.</p>
        <p class="muted">
          Operators: open the <span class="mono">Console:</span> URL <span class="mono">capsule serve</span> printed; it signs you in once.
        </p>
        <input type="password" name="apiKey" autocomplete="off" placeholder="cap_…" value={key} onInput={(e) => setKey(e.currentTarget.value)} aria-label="API key" />
        <ErrorBox error={error} />
        <button type="submit" class="primary" disabled={busy || key.trim() === ''}>
          Sign in
        </button>
      </form>
    </main>
  );
}

/**
 * Sign-in: a one-time login token (from the URL `capsule serve` prints) or an API key is
 * exchanged for a short-lived session key. Only the session key is kept, in sessionStorage
 * (this tab, until it closes); the long-lived API key is never stored.
 */
import { json, setBearer } from './api.js';
import type { Session } from '../../src/wire/index.js';

const STORAGE_KEY = 'capsule.session';

export type ConsoleSession = Session;

export function loadSession(): ConsoleSession | undefined {
  const text = sessionStorage.getItem(STORAGE_KEY);
  if (!text) return undefined;
  try {
    const session = JSON.parse(text) as ConsoleSession;
    if (Date.parse(session.expiresAt) <= Date.now()) throw new Error('expired');
    setBearer(session.sessionKey);
    return session;
  } catch {
    sessionStorage.removeItem(STORAGE_KEY);
    return undefined;
  }
}

function keep(session: Session): ConsoleSession {
  sessionStorage.setItem(STORAGE_KEY, JSON.stringify(session));
  setBearer(session.sessionKey);
  return session;
}

export async function signInWithToken(loginToken: string): Promise<ConsoleSession> {
  return keep(await json<Session>('/v1/sessions/login', { method: 'POST', body: { loginToken } }));
}

export async function signInWithKey(apiKey: string): Promise<ConsoleSession> {
  return keep(await json<Session>('/v1/sessions', { method: 'POST', key: apiKey.trim() }));
}

export async function signOut(): Promise<void> {
  try {
    await json('/v1/sessions/current', { method: 'DELETE' });
  } finally {
    forget();
  }
}

export function forget(): void {
  sessionStorage.removeItem(STORAGE_KEY);
  setBearer(undefined);
}

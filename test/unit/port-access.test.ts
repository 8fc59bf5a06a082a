import { describe, expect, it } from 'vitest';
import { PortUrlSigner, parsePortHost, takeCookie, withoutToken } from '../../src/server/ports/port-access.js';
import { answerHeaders, forwardHeaders } from '../../src/server/ports/port-proxy.js';

const grant = { tenantId: 'acme.corp', sandboxId: 'abcdefghijklmnopqrst', port: 8000 };

describe('signed port URLs', () => {
  const signer = new PortUrlSigner(Buffer.alloc(32, 7));
  const now = 1_800_000_000_000;

  it('grants the port it was signed for, to its tenant, until it expires', () => {
    const token = signer.sign(grant, now + 60_000);
    expect(signer.check(token, grant.sandboxId, 8000, now)).toEqual({ ok: true, tenantId: 'acme.corp' });
    expect(signer.check(token, grant.sandboxId, 8000, now + 60_000)).toEqual({ ok: false, reason: 'expired' });
    expect(signer.check(token, grant.sandboxId, 8001, now)).toEqual({ ok: false, reason: 'mismatch' });
    expect(signer.check(token, 'bbcdefghijklmnopqrst', 8000, now)).toEqual({ ok: false, reason: 'mismatch' });
  });

  it('refuses a token with another tenant, expiry or secret', () => {
    const token = signer.sign(grant, now + 60_000);
    const [expires, , mac] = [token.slice(0, token.indexOf('.')), '', token.slice(token.lastIndexOf('.') + 1)];
    expect(signer.check(`${expires}.other.${mac}`, grant.sandboxId, 8000, now).ok).toBe(false);
    expect(signer.check(`${Number(expires) + 3600}.acme.corp.${mac}`, grant.sandboxId, 8000, now).ok).toBe(false);
    expect(new PortUrlSigner(Buffer.alloc(32, 8)).check(token, grant.sandboxId, 8000, now).ok).toBe(false);
    expect(signer.check('garbage', grant.sandboxId, 8000, now)).toEqual({ ok: false, reason: 'malformed' });
  });
});

describe('host routing', () => {
  it('reads P-ID.DOMAIN, with or without a port, case-insensitively', () => {
    expect(parsePortHost('8000-abcdefghijklmnopqrst.sandboxes.test', 'sandboxes.test')).toEqual({ port: 8000, sandboxId: 'abcdefghijklmnopqrst' });
    expect(parsePortHost('8000-ABCDEFGHIJKLMNOPQRST.Sandboxes.Test:7070', 'sandboxes.test')).toEqual({ port: 8000, sandboxId: 'abcdefghijklmnopqrst' });
  });

  it('ignores other hosts, ports out of range and ids that cannot exist', () => {
    expect(parsePortHost('127.0.0.1:7070', 'sandboxes.test')).toBeUndefined();
    expect(parsePortHost('8000-abcdefghijklmnopqrst.sandboxes.test.evil', 'sandboxes.test')).toBeUndefined();
    expect(parsePortHost('70000-abcdefghijklmnopqrst.sandboxes.test', 'sandboxes.test')).toBeUndefined();
    expect(parsePortHost('8000-short.sandboxes.test', 'sandboxes.test')).toBeUndefined();
    expect(parsePortHost('x.8000-abcdefghijklmnopqrst.sandboxes.test', 'sandboxes.test')).toBeUndefined();
    expect(parsePortHost(undefined, 'sandboxes.test')).toBeUndefined();
  });
});

describe('what reaches the sandbox', () => {
  it('drops the signed-URL token from the query and its cookie from the Cookie header', () => {
    expect(withoutToken('/a?capsule_token=x&b=1')).toBe('/a?b=1');
    expect(withoutToken('/a?capsule_token=x')).toBe('/a');
    expect(withoutToken('/a?b=1')).toBe('/a?b=1');
    expect(takeCookie('app=1; capsule_port_token=t; x=2', 'capsule_port_token')).toEqual({ value: 't', rest: 'app=1; x=2' });
  });

  it('forwards no credential Capsule used, no hop-by-hop header, and the app its own Authorization', () => {
    const headers = {
      authorization: 'Bearer cap_secret',
      'x-api-key': 'cap_secret',
      'e2b-traffic-access-token': 'token',
      'x-access-token': 'token',
      connection: 'keep-alive',
      cookie: 'capsule_port_token=t',
      accept: 'text/html',
    };
    const byKey = forwardHeaders(headers, { path: '/', port: 1, credential: 'api-key', isUpgrade: false });
    expect(byKey).toMatchObject({ accept: 'text/html', 'x-forwarded-proto': 'http' });
    for (const name of ['authorization', 'x-api-key', 'e2b-traffic-access-token', 'x-access-token', 'connection', 'cookie']) expect(byKey[name]).toBeUndefined();
    const byUrl = forwardHeaders(headers, { path: '/', port: 1, credential: 'signed-url', isUpgrade: false });
    expect(byUrl.authorization).toBe('Bearer cap_secret');
  });

  it('keeps a WebSocket upgrade and the answer cookies, adding the URL cookie', () => {
    const upgraded = forwardHeaders({ connection: 'Upgrade', upgrade: 'websocket' }, { path: '/', port: 1, credential: 'public', isUpgrade: true });
    expect(upgraded).toMatchObject({ connection: 'Upgrade', upgrade: 'websocket' });
    const answer = answerHeaders({ 'set-cookie': ['app=1'], 'transfer-encoding': 'chunked' }, 'capsule_port_token=t');
    expect(answer).toEqual({ 'set-cookie': ['app=1', 'capsule_port_token=t'] });
  });
});

import { SandboxError } from '../../errors/index.js';

/**
 * Turns skopeo's stderr (it exits 1 for every failure) into a stable error. The texts are
 * containers/image's (R1 §4.1): `pinging container registry …: connection refused`,
 * `unauthorized: authentication required`, `manifest unknown`.
 */
export function classifySkopeoError(display: string, stderrLines: readonly string[], hasCredentials: boolean): SandboxError {
  const text = stderrLines.join('\n');
  const last = lastMessage(stderrLines);
  const details = { image: display, lastLines: stderrLines.slice(-6) };
  if (/unauthorized|authentication required|denied|invalid username\/password|status code 401|status code 403/i.test(text)) {
    return new SandboxError('REGISTRY_UNAUTHORIZED', `the registry refused access to ${display}${hasCredentials ? ' with the stored credentials' : ' without credentials'}: ${last}`, {
      details,
      hint: hasCredentials
        ? 'The operator stores registry credentials for Capsule; check the user name and password stored for this registry.'
        : 'The operator can store credentials for this registry (Capsule never takes them from a request).',
    });
  }
  if (/manifest unknown|name unknown|not found|no descriptor found|no such file or directory|does not exist|no such image|reference does not exist|choosing image instance/i.test(text)) {
    return new SandboxError('IMAGE_NOT_FOUND', `no image ${display}: ${last}`, {
      details,
      hint: 'Check the repository name and the tag or digest (the registry does not have this one).',
    });
  }
  if (/connection refused|no such host|i\/o timeout|dial tcp|network is unreachable|pinging container registry|server misbehaving|x509|tls:|http response to https|connection reset|EOF/i.test(text)) {
    return new SandboxError('REGISTRY_UNREACHABLE', `cannot reach the registry of ${display}: ${last}`, {
      details,
      hint: 'Check the registry host and port and that this machine can reach it; registries other than loopback need TLS.',
    });
  }
  return new SandboxError('BUILD_FAILED', `skopeo could not fetch ${display}: ${last}`, { details: { ...details, step: 'base' } });
}

/** The most specific part of skopeo's last line (`time=… level=fatal msg="…"` → the msg). */
function lastMessage(lines: readonly string[]): string {
  const line = [...lines].reverse().find((l) => l.trim() !== '') ?? 'no output';
  const msg = /msg="((?:[^"\\]|\\.)*)"/.exec(line)?.[1];
  return (msg ?? line).replace(/\\"/g, '"').slice(0, 500);
}

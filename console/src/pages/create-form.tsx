import { useEffect, useState } from 'preact/hooks';
import { json } from '../api.js';
import { ErrorBox } from '../components/error-box.js';
import { FEATURES } from '../features.js';
import type { SandboxInfo } from '../../../src/wire/index.js';

const MiB = 1024 * 1024;

/** Metadata typed as `k=v, k2=v2`. */
function parseMetadata(text: string): Record<string, string> {
  const metadata: Record<string, string> = {};
  for (const pair of text.split(',').map((p) => p.trim()).filter((p) => p !== '')) {
    const at = pair.indexOf('=');
    if (at <= 0) throw new Error(`metadata "${pair}" is not key=value`);
    metadata[pair.slice(0, at).trim()] = pair.slice(at + 1).trim();
  }
  return metadata;
}

/** A template as GET /v1/templates lists it: a name, or an object with a ref or name. */
function templateName(t: unknown): string {
  if (typeof t === 'string') return t;
  const { ref, name } = (t ?? {}) as { ref?: unknown; name?: unknown };
  return typeof ref === 'string' ? ref : typeof name === 'string' ? name : '';
}

/**
 * Create a sandbox from a template: the fields most often set, the rest at the server's
 * defaults. Templates come from GET /v1/templates when the server has it.
 */
export function CreateForm({ features, tenant, onCreated }: { features: Set<string>; tenant: string | undefined; onCreated: (info: SandboxInfo) => void }) {
  const [templates, setTemplates] = useState<string[]>();
  const [form, setForm] = useState({ template: '', backend: 'namespace', memoryMiB: '512', cpus: '1', ttlMinutes: '30', wallClockSeconds: '600', network: 'none', allow: '', metadata: '' });
  const [error, setError] = useState<unknown>();
  const [busy, setBusy] = useState(false);
  useEffect(() => {
    if (!features.has(FEATURES.templates)) return;
    json<Record<string, unknown>>('/v1/templates', { tenant })
      .then((body) => {
        const list = (Array.isArray(body) ? body : (body.templates as unknown[] | undefined)) ?? [];
        setTemplates(list.map(templateName).filter((t) => t !== ''));
      })
      .catch(() => setTemplates(undefined));
  }, [features, tenant]);
  const set = (field: keyof typeof form) => (event: Event) => setForm({ ...form, [field]: (event.currentTarget as HTMLInputElement).value });
  const submit = async (event: Event) => {
    event.preventDefault();
    setBusy(true);
    setError(undefined);
    try {
      const spec = {
        backend: form.backend,
        ...(form.template.trim() !== '' ? { template: form.template.trim() } : {}),
        limits: { memoryBytes: Math.round(Number(form.memoryMiB) * MiB), cpus: Number(form.cpus), wallClockMs: Math.round(Number(form.wallClockSeconds) * 1000) },
        ttlMs: Math.round(Number(form.ttlMinutes) * 60_000),
        network: form.network === 'none' ? { mode: 'none' } : { mode: form.network, allow: form.allow.split(',').map((a) => a.trim()).filter((a) => a !== '') },
      };
      onCreated(await json<SandboxInfo>('/v1/sandboxes', { method: 'POST', body: { spec, metadata: parseMetadata(form.metadata) }, tenant }));
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="create card" onSubmit={(e) => void submit(e)} data-testid="create-form">
      <h3>New sandbox{tenant ? ` in tenant ${tenant}` : ''}</h3>
      <div class="grid">
        <label>
          Template
          {templates ? (
            <select name="template" value={form.template} onChange={set('template')}>
              <option value="">server default</option>
              {templates.map((t) => (
                <option key={t} value={t}>
                  {t}
                </option>
              ))}
            </select>
          ) : (
            <input name="template" placeholder="server default (e.g. host)" value={form.template} onInput={set('template')} />
          )}
        </label>
        <label>
          Backend
          <select name="backend" value={form.backend} onChange={set('backend')}>
            <option value="namespace">namespace</option>
            <option value="gvisor">gvisor</option>
          </select>
        </label>
        <label>
          Memory (MiB)
          <input name="memoryMiB" type="number" min="16" value={form.memoryMiB} onInput={set('memoryMiB')} />
        </label>
        <label>
          CPUs
          <input name="cpus" type="number" min="0.1" step="0.1" value={form.cpus} onInput={set('cpus')} />
        </label>
        <label>
          Time to live (minutes)
          <input name="ttlMinutes" type="number" min="1" value={form.ttlMinutes} onInput={set('ttlMinutes')} />
        </label>
        <label>
          Wall clock per process (s)
          <input name="wallClockSeconds" type="number" min="1" value={form.wallClockSeconds} onInput={set('wallClockSeconds')} />
        </label>
        <label>
          Network
          <select name="network" value={form.network} onChange={set('network')}>
            <option value="none">none</option>
            <option value="allowlist">allowlist</option>
            <option value="internet">internet</option>
          </select>
        </label>
        {form.network === 'allowlist' && (
          <label>
            Allow (comma-separated)
            <input name="allow" placeholder="pypi.org, *.github.com:443" value={form.allow} onInput={set('allow')} />
          </label>
        )}
        <label class="wide">
          Metadata (key=value, comma-separated)
          <input name="metadata" placeholder="owner=alice, task=42" value={form.metadata} onInput={set('metadata')} />
        </label>
      </div>
      <ErrorBox error={error} onDismiss={() => setError(undefined)} />
      <button type="submit" class="primary" disabled={busy}>
        {busy ? 'Creating…' : 'Create'}
      </button>
    </form>
  );
}

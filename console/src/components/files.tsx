import { useEffect, useRef, useState } from 'preact/hooks';
import { call, json } from '../api.js';
import { bytes } from '../format.js';
import { ErrorBox } from './error-box.js';
import type { FileEntry } from '../../../src/wire/index.js';

function parentOf(path: string): string {
  const at = path.replace(/\/+$/, '').lastIndexOf('/');
  return at <= 0 ? '/' : path.slice(0, at);
}

function join(dir: string, name: string): string {
  return `${dir.replace(/\/+$/, '')}/${name}`;
}

/** A directory of the sandbox: browse, upload (streamed PUT), download, remove. */
export function Files({ sandboxId, tenant, start, running }: { sandboxId: string; tenant: string | undefined; start: string; running: boolean }) {
  const base = `/v1/sandboxes/${sandboxId}/files`;
  const [dir, setDir] = useState(start);
  const [entries, setEntries] = useState<FileEntry[]>();
  const [error, setError] = useState<unknown>();
  const [busy, setBusy] = useState('');
  const picker = useRef<HTMLInputElement>(null);

  const load = (path: string) =>
    json<{ entries: FileEntry[] }>(`${base}/list`, { query: { path, depth: 1 }, tenant })
      .then((r) => {
        setEntries(r.entries.sort((a, b) => (a.type === 'dir' ? 0 : 1) - (b.type === 'dir' ? 0 : 1) || a.name.localeCompare(b.name)));
        setError(undefined);
      })
      .catch((e: unknown) => {
        setEntries([]);
        setError(e);
      });
  useEffect(() => {
    if (running) void load(dir);
  }, [dir, sandboxId, tenant, running]);

  const upload = async (files: FileList | null) => {
    if (!files) return;
    try {
      for (const file of [...files]) {
        setBusy(`uploading ${file.name}`);
        await call(base, { method: 'PUT', query: { path: join(dir, file.name) }, raw: file, tenant });
      }
      await load(dir);
    } catch (e) {
      setError(e);
    } finally {
      setBusy('');
      if (picker.current) picker.current.value = '';
    }
  };
  const download = async (entry: FileEntry) => {
    try {
      const blob = await (await call(base, { query: { path: entry.path }, tenant })).blob();
      const link = document.createElement('a');
      link.href = URL.createObjectURL(blob);
      link.download = entry.name;
      link.click();
      setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
    } catch (e) {
      setError(e);
    }
  };
  const remove = async (entry: FileEntry) => {
    if (!confirm(`Remove ${entry.path}${entry.type === 'dir' ? ' and everything in it' : ''}?`)) return;
    try {
      await call(base, { method: 'DELETE', query: { path: entry.path }, tenant });
      await load(dir);
    } catch (e) {
      setError(e);
    }
  };

  if (!running) return <p class="muted">Files can be browsed while the sandbox runs.</p>;
  return (
    <div class="files">
      <div class="row">
        <button onClick={() => setDir(parentOf(dir))} disabled={dir === '/'}>
          Up
        </button>
        <input class="grow mono" value={dir} onChange={(e) => setDir(e.currentTarget.value || '/')} aria-label="directory" />
        <label class="button">
          Upload
          <input ref={picker} type="file" multiple hidden data-testid="upload" onChange={(e) => void upload(e.currentTarget.files)} />
        </label>
        <span class="muted">{busy}</span>
      </div>
      <ErrorBox error={error} onDismiss={() => setError(undefined)} />
      <table class="table" data-testid="file-list">
        <thead>
          <tr>
            <th>name</th>
            <th>size</th>
            <th>modified</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {entries?.length === 0 && (
            <tr>
              <td colSpan={4} class="muted">
                Empty directory.
              </td>
            </tr>
          )}
          {entries?.map((entry) => (
            <tr key={entry.path} data-file={entry.name}>
              <td class="mono">
                {entry.type === 'dir' ? (
                  <button class="link" onClick={() => setDir(entry.path)}>
                    {entry.name}/
                  </button>
                ) : (
                  entry.name
                )}
                {entry.symlinkTarget && <span class="muted"> → {entry.symlinkTarget}</span>}
              </td>
              <td>{entry.type === 'dir' ? '' : bytes(entry.size)}</td>
              <td>{new Date(entry.modifiedAt).toLocaleString()}</td>
              <td class="actions">
                {entry.type === 'file' && (
                  <button class="small" onClick={() => void download(entry)}>
                    Download
                  </button>
                )}
                <button class="small" onClick={() => void remove(entry)}>
                  Remove
                </button>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

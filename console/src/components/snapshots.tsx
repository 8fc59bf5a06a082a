import { useEffect, useState } from 'preact/hooks';
import { json } from '../api.js';
import { ErrorBox } from './error-box.js';

type Item = Record<string, unknown>;

const idOf = (item: Item): string => {
  const id = item.snapshotId ?? item.id ?? item.name;
  return typeof id === 'string' || typeof id === 'number' ? String(id) : '';
};
const parentOf = (item: Item): string | undefined => {
  const parent = item.parentSnapshotId ?? item.parentId ?? (item.lineage as Item | undefined)?.snapshotId;
  return typeof parent === 'string' ? parent : undefined;
};

function Tree({ all, nodes, depth }: { all: Item[]; nodes: Item[]; depth: number }) {
  if (nodes.length === 0 || depth > 20) return null;
  return (
    <ul class="tree">
      {nodes.map((item) => (
        <li key={idOf(item)}>
          <span class="mono">{idOf(item)}</span>
          {typeof item.name === 'string' && item.name !== idOf(item) && ` · ${item.name}`}
          {typeof item.mode === 'string' && ` · ${item.mode}`}
          {typeof item.createdAt === 'string' && <span class="muted"> · {new Date(item.createdAt).toLocaleString()}</span>}
          <Tree all={all} nodes={all.filter((i) => parentOf(i) === idOf(item))} depth={depth + 1} />
        </li>
      ))}
    </ul>
  );
}

/**
 * A sandbox's snapshots as a tree by lineage, shown only when the server has the snapshot API
 * (feature-detected in /openapi.json). Fields are read by name, so the panel follows the API.
 */
export function Snapshots({ sandboxId, tenant, generation }: { sandboxId: string; tenant: string | undefined; generation: number }) {
  const [items, setItems] = useState<Item[]>();
  const [error, setError] = useState<unknown>();
  useEffect(() => {
    json<Item>(`/v1/sandboxes/${sandboxId}/snapshots`, { tenant })
      .then((body) => setItems((Array.isArray(body) ? body : (body.snapshots as Item[] | undefined)) ?? []))
      .catch(setError);
  }, [sandboxId, tenant, generation]);
  return (
    <div>
      <ErrorBox error={error} />
      {items?.length === 0 && <p class="muted">No snapshots yet.</p>}
      {items && <Tree all={items} nodes={items.filter((i) => !items.some((j) => idOf(j) === parentOf(i)))} depth={0} />}
    </div>
  );
}

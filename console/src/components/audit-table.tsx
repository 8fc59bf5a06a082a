import type { AuditRecord } from '../../../src/wire/index.js';
import { sandboxHref } from '../router.js';

/** Audit records, one row each; the chain's hashes shortened (the full one on hover). */
export function AuditTable({ records, showTenant }: { records: AuditRecord[]; showTenant: boolean }) {
  return (
    <table class="table audit" data-testid="audit-table">
      <thead>
        <tr>
          <th>#</th>
          <th>at</th>
          {showTenant && <th>tenant</th>}
          <th>key</th>
          <th>operation</th>
          <th>phase</th>
          <th>sandbox</th>
          <th>outcome</th>
          <th>policy</th>
          <th>hash</th>
        </tr>
      </thead>
      <tbody>
        {records.length === 0 && (
          <tr>
            <td colSpan={10} class="muted">
              No records.
            </td>
          </tr>
        )}
        {records.map((r) => (
          <tr key={r.seq} data-operation={r.operation}>
            <td>{r.seq}</td>
            <td>{new Date(r.at).toLocaleString()}</td>
            {showTenant && <td>{r.tenantId}</td>}
            <td class="mono">{r.keyId ?? 'server'}</td>
            <td class="mono">{r.operation}</td>
            <td>{r.phase}</td>
            <td class="mono">{r.sandboxId ? <a href={sandboxHref(r.sandboxId, 'overview', showTenant ? r.tenantId : undefined)}>{r.sandboxId}</a> : ''}</td>
            <td class={r.outcome && r.outcome !== 'ok' ? 'bad' : ''}>{r.outcome ?? ''}</td>
            <td class="mono clip" title={r.policy ?? ''}>
              {r.policy ?? ''}
            </td>
            <td class="mono" title={r.hash}>
              {r.hash.slice(0, 10)}…
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

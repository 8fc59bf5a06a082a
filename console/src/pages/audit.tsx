import { useEffect, useState } from 'preact/hooks';
import { json } from '../api.js';
import { AuditTable } from '../components/audit-table.js';
import { ErrorBox } from '../components/error-box.js';
import type { AuditRecord } from '../../../src/wire/index.js';

type Verify = { ok: true; records: number; headHash: string } | { ok: false; records: number; badSeq: number; reason: string };

const PAGE = 100;

/** The audit chain, newest first, filterable, with the server's verification of the whole chain. */
export function AuditPage() {
  const [filters, setFilters] = useState({ tenant: '', sandboxId: '', operation: '', outcome: '' });
  const [draft, setDraft] = useState(filters);
  const [records, setRecords] = useState<AuditRecord[]>([]);
  const [more, setMore] = useState(false);
  const [verify, setVerify] = useState<Verify>();
  const [error, setError] = useState<unknown>();
  const load = (before?: number) =>
    json<{ records: AuditRecord[] }>('/v1/audit', { query: { order: 'desc', limit: PAGE, before, ...filters } })
      .then((r) => {
        setRecords((old) => (before === undefined ? r.records : [...old, ...r.records]));
        setMore(r.records.length === PAGE);
        setError(undefined);
      })
      .catch(setError);
  useEffect(() => void load(), [filters]);
  const check = () =>
    json<Verify>('/v1/audit/verify')
      .then(setVerify)
      .catch(setError);
  useEffect(() => void check(), []);
  const field = (name: keyof typeof draft, placeholder: string) => (
    <input placeholder={placeholder} aria-label={name} value={draft[name]} onInput={(e) => setDraft({ ...draft, [name]: e.currentTarget.value.trim() })} />
  );
  return (
    <section>
      <div class="row page-head">
        <h2>Audit</h2>
        {verify && (
          <span class={`verify ${verify.ok ? 'ok' : 'broken'}`} data-testid="audit-verify" data-ok={String(verify.ok)}>
            {verify.ok ? `chain verified: ${verify.records} records, head ${verify.headHash.slice(0, 16)}…` : `chain broken at record ${verify.badSeq}: ${verify.reason}`}
          </span>
        )}
        <button class="small" onClick={() => void check()}>
          Verify again
        </button>
      </div>
      <form
        class="row filters"
        onSubmit={(e) => {
          e.preventDefault();
          setFilters(draft);
        }}
      >
        {field('tenant', 'tenant')}
        {field('sandboxId', 'sandbox id')}
        {field('operation', 'operation, e.g. sandboxes.create')}
        {field('outcome', 'outcome, e.g. ok, limit:memory')}
        <button type="submit">Filter</button>
      </form>
      <ErrorBox error={error} />
      <AuditTable records={records} showTenant />
      {more && (
        <button onClick={() => void load(records.at(-1)?.seq)} class="small">
          Older records
        </button>
      )}
    </section>
  );
}

import { useState } from 'preact/hooks';

export interface ConfirmRequest {
  title: string;
  body: string;
  action: string;
  run: () => Promise<unknown>;
}

/** A destructive action asks first; the dialog stays until the action settles. */
export function ConfirmDialog({ request, onClose }: { request: ConfirmRequest | undefined; onClose: (error?: unknown) => void }) {
  const [busy, setBusy] = useState(false);
  if (!request) return null;
  const go = async () => {
    setBusy(true);
    try {
      await request.run();
      onClose();
    } catch (error) {
      onClose(error);
    } finally {
      setBusy(false);
    }
  };
  return (
    <div class="modal-backdrop">
      <div class="modal" role="dialog" aria-modal="true" aria-label={request.title}>
        <h3>{request.title}</h3>
        <p>{request.body}</p>
        <div class="row">
          <button onClick={() => onClose()} disabled={busy}>
            Cancel
          </button>
          <button class="danger" data-testid="confirm" onClick={() => void go()} disabled={busy}>
            {request.action}
          </button>
        </div>
      </div>
    </div>
  );
}

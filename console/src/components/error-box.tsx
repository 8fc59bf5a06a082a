import { errorBody } from '../api.js';

/** An API error as the user should read it: its code, what happened, and what to do. */
export function ErrorBox({ error, onDismiss }: { error: unknown; onDismiss?: () => void }) {
  if (error === undefined || error === null) return null;
  const body = errorBody(error);
  return (
    <div class="error" role="alert" data-code={body.code}>
      <div>
        <strong class="code">{body.code}</strong> {body.message}
      </div>
      {body.hint && <div class="hint">{body.hint}</div>}
      {body.requestId && <div class="request-id">request {body.requestId}</div>}
      {onDismiss && (
        <button class="link" onClick={onDismiss}>
          dismiss
        </button>
      )}
    </div>
  );
}

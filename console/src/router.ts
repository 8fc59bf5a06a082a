import { useEffect, useState } from 'preact/hooks';

/** Hash routes: #/sandboxes, #/sandbox/<id>/<tab>?tenant=<t>, #/metrics, #/audit. */
export interface Route {
  page: 'sandboxes' | 'sandbox' | 'metrics' | 'audit';
  sandboxId?: string;
  tab?: string;
  tenant?: string;
}

export function parseRoute(hash: string): Route {
  const [path = '', query = ''] = hash.replace(/^#\/?/, '').split('?');
  const params = new URLSearchParams(query);
  const tenant = params.get('tenant') ?? undefined;
  const parts = path.split('/').filter((p) => p !== '');
  if (parts[0] === 'sandbox' && parts[1]) return { page: 'sandbox', sandboxId: parts[1], tab: parts[2] ?? 'overview', tenant };
  if (parts[0] === 'metrics') return { page: 'metrics' };
  if (parts[0] === 'audit') return { page: 'audit' };
  return { page: 'sandboxes' };
}

export function sandboxHref(sandboxId: string, tab = 'overview', tenant?: string): string {
  return `#/sandbox/${sandboxId}/${tab}${tenant ? `?tenant=${encodeURIComponent(tenant)}` : ''}`;
}

export function useRoute(): Route {
  const [route, setRoute] = useState(() => parseRoute(location.hash));
  useEffect(() => {
    const update = () => setRoute(parseRoute(location.hash));
    addEventListener('hashchange', update);
    return () => removeEventListener('hashchange', update);
  }, []);
  return route;
}

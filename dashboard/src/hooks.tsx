import { createContext, useCallback, useContext, useEffect, useRef, useState } from 'react';
import type { NativeClient } from '../../src/client/native-client.ts';
import { describeError, isUnauthorized } from './session.ts';

export interface Api {
  client: NativeClient;
  /** Called when the API says the key is no longer valid (revoked, expired): back to the login. */
  onUnauthorized: () => void;
}

export const ApiContext = createContext<Api | null>(null);

export function useApi(): Api {
  const api = useContext(ApiContext);
  if (!api) throw new Error('useApi outside a logged-in page');
  return api;
}

export interface Loaded<T> {
  data: T | undefined;
  error: string | null;
  reload: () => Promise<void>;
}

/**
 * Loads with `load` now and then every `intervalMs` (live updates), while the tab is visible.
 * A failure is kept as a readable message; the last good data stays on screen beside it.
 */
export function usePolled<T>(load: (api: Api) => Promise<T>, deps: unknown[], intervalMs = 3000): Loaded<T> {
  const api = useApi();
  const [data, setData] = useState<T>();
  const [error, setError] = useState<string | null>(null);
  const loadRef = useRef(load);
  loadRef.current = load;
  const generation = useRef(0);

  const reload = useCallback(async () => {
    const mine = ++generation.current;
    try {
      const value = await loadRef.current(api);
      if (mine !== generation.current) return; // a newer load (or new deps) superseded this one
      setData(value);
      setError(null);
    } catch (err) {
      if (mine !== generation.current) return;
      if (isUnauthorized(err)) return api.onUnauthorized();
      setError(describeError(err));
    }
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [api, ...deps]);

  useEffect(() => {
    setData(undefined);
    void reload();
    if (!intervalMs) return;
    const timer = setInterval(() => {
      if (document.visibilityState === 'visible') void reload();
    }, intervalMs);
    return () => {
      clearInterval(timer);
      generation.current++;
    };
  }, [reload, intervalMs]);

  return { data, error, reload };
}

/**
 * Runs a user's action (a button) and keeps its failure as a readable message; `busy` while it
 * runs so the button cannot be pressed twice.
 */
export function useAction(): { busy: boolean; error: string | null; run: (action: () => Promise<unknown>) => Promise<boolean>; clear: () => void } {
  const api = useApi();
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const run = useCallback(async (action: () => Promise<unknown>) => {
    setBusy(true);
    setError(null);
    try {
      await action();
      return true;
    } catch (err) {
      if (isUnauthorized(err)) api.onUnauthorized();
      else setError(describeError(err));
      return false;
    } finally {
      setBusy(false);
    }
  }, [api]);
  return { busy, error, run, clear: () => setError(null) };
}

export function ErrorMessage({ error }: { error: string | null | undefined }) {
  if (!error) return null;
  return <p className="error" role="alert">{error}</p>;
}

/** "3 min ago" from an ISO time. */
export function age(iso: string | null | undefined, now = Date.now()): string {
  if (!iso) return '—';
  const seconds = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (seconds < 60) return `${seconds} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  if (seconds < 86_400) return `${Math.floor(seconds / 3600)} h`;
  return `${Math.floor(seconds / 86_400)} d`;
}

export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${unit === 0 ? value : value.toFixed(1)} ${units[unit]}`;
}

/** `a=1, b=2` → `{a: '1', b: '2'}`; throws naming the bad entry. */
export function parseLabels(text: string): Record<string, string> {
  const labels: Record<string, string> = {};
  for (const part of text.split(',').map((s) => s.trim()).filter(Boolean)) {
    const eq = part.indexOf('=');
    if (eq <= 0) throw new Error(`labels: "${part}" is not key=value`);
    labels[part.slice(0, eq).trim()] = part.slice(eq + 1).trim();
  }
  return labels;
}

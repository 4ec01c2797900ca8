// The API key the dashboard calls with. It lives in sessionStorage (gone when the tab closes)
// unless the user ticks "remember me", then in localStorage; never in a URL or a cookie, so the
// server sees it only as the Authorization header of API calls (and as the terminal
// WebSocket's access_token, the one place the API requires it in the URL).
import { NativeClient, NativeApiError } from '../../src/client/native-client.ts';

const STORAGE_KEY = 'nestbox.apiKey';

export function storedKey(): string | null {
  return sessionStorage.getItem(STORAGE_KEY) ?? localStorage.getItem(STORAGE_KEY);
}

export function storeKey(key: string, remember: boolean): void {
  forgetKey();
  (remember ? localStorage : sessionStorage).setItem(STORAGE_KEY, key);
}

export function forgetKey(): void {
  sessionStorage.removeItem(STORAGE_KEY);
  localStorage.removeItem(STORAGE_KEY);
}

/** A client of this server's native API (the dashboard is served from the same origin). */
export function clientFor(key: string): NativeClient {
  return new NativeClient({ url: window.location.origin, apiKey: key });
}

/** An error as a person should read it: the API's code and message, or what went wrong on the way. */
export function describeError(err: unknown): string {
  if (err instanceof NativeApiError) return `${err.message} (${err.code}, HTTP ${err.status})`;
  if (err instanceof TypeError) return `Cannot reach the server: ${err.message}`;
  if (err instanceof Error) return err.message;
  return String(err);
}

export function isUnauthorized(err: unknown): boolean {
  return err instanceof NativeApiError && err.status === 401;
}

import { useMemo, useState, type FormEvent } from 'react';
import { ApiContext, ErrorMessage, type Api } from './hooks.tsx';
import { Link, navigate, usePath } from './router.tsx';
import { clientFor, describeError, forgetKey, storedKey, storeKey } from './session.ts';
import { SandboxesPage } from './pages/Sandboxes.tsx';
import { SandboxPage } from './pages/Sandbox.tsx';
import { SnapshotsPage } from './pages/Snapshots.tsx';
import { ImagesPage } from './pages/Images.tsx';
import { KeysPage } from './pages/Keys.tsx';

export function App() {
  const [key, setKey] = useState<string | null>(() => storedKey());
  const [notice, setNotice] = useState<string | null>(null);
  const api = useMemo<Api | null>(() => key ? {
    client: clientFor(key),
    onUnauthorized: () => {
      forgetKey();
      setKey(null);
      setNotice('The server no longer accepts this API key. Log in again.');
    },
  } : null, [key]);

  if (!api) return <Login notice={notice} onLogin={(k) => { setNotice(null); setKey(k); }} />;
  const logout = () => {
    forgetKey();
    setKey(null);
    navigate('/');
  };
  return (
    <ApiContext.Provider value={api}>
      <Shell onLogout={logout} />
    </ApiContext.Provider>
  );
}

function Login({ notice, onLogin }: { notice: string | null; onLogin: (key: string) => void }) {
  const [value, setValue] = useState('');
  const [remember, setRemember] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (event: FormEvent) => {
    event.preventDefault();
    const key = value.trim();
    if (!key) return setError('API key: enter the key (it starts with nbx_)');
    setBusy(true);
    setError(null);
    try {
      // A call every preset may make: proves the key before it is stored.
      await clientFor(key).listSandboxes({ limit: 1 });
      storeKey(key, remember);
      onLogin(key);
    } catch (err) {
      setError(describeError(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <main className="login">
      <form onSubmit={submit} className="card">
        <h1>Nestbox</h1>
        {notice && <p className="notice">{notice}</p>}
        <label>
          API key
          <input name="apiKey" type="password" autoComplete="current-password" value={value} onChange={(e) => setValue(e.target.value)} autoFocus />
        </label>
        <label className="inline">
          <input name="remember" type="checkbox" checked={remember} onChange={(e) => setRemember(e.target.checked)} />
          Remember me on this browser
        </label>
        <ErrorMessage error={error} />
        <button type="submit" disabled={busy}>Log in</button>
        <p className="hint">The server prints its bootstrap key at its first start and keeps it in <code>.nestbox/bootstrap-api-key</code>. <a href="/docs">API reference</a></p>
      </form>
    </main>
  );
}

const NAV = [
  { to: '/', label: 'Sandboxes', match: (p: string) => p === '/' || p.startsWith('/sandboxes') },
  { to: '/snapshots', label: 'Snapshots', match: (p: string) => p.startsWith('/snapshots') },
  { to: '/images', label: 'Images', match: (p: string) => p.startsWith('/images') },
  { to: '/keys', label: 'API keys', match: (p: string) => p.startsWith('/keys') },
];

function Shell({ onLogout }: { onLogout: () => void }) {
  const path = usePath();
  const sandbox = /^\/sandboxes\/([^/]+)$/.exec(path);
  let page;
  if (path === '/' || path === '/sandboxes') page = <SandboxesPage />;
  else if (sandbox) page = <SandboxPage key={sandbox[1]} id={decodeURIComponent(sandbox[1])} />;
  else if (path === '/snapshots') page = <SnapshotsPage />;
  else if (path === '/images') page = <ImagesPage />;
  else if (path === '/keys') page = <KeysPage />;
  else page = <section><h2>Not found</h2><p>No page at {path}. <Link to="/">Sandboxes</Link></p></section>;
  return (
    <>
      <header className="top">
        <Link to="/" className="brand">Nestbox</Link>
        <nav>
          {NAV.map((item) => (
            <Link key={item.to} to={item.to} className={item.match(path) ? 'active' : undefined}>{item.label}</Link>
          ))}
          <a href="/docs" target="_blank" rel="noreferrer">API reference</a>
        </nav>
        <button type="button" className="secondary" onClick={onLogout}>Log out</button>
      </header>
      <main>{page}</main>
    </>
  );
}

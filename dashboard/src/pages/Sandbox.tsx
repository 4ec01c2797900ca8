import { lazy, Suspense, useState, type ChangeEvent, type FormEvent } from 'react';
import type { Sandbox } from '../../../src/client/native-client.ts';
import { age, bytes, ErrorMessage, useAction, useApi, usePolled } from '../hooks.tsx';
import { Link, navigate } from '../router.tsx';
import { Labels } from './Sandboxes.tsx';

// xterm.js is most of the bundle's weight: loaded when a sandbox page first shows a terminal.
const TerminalPanel = lazy(async () => ({ default: (await import('./Terminal.tsx')).TerminalPanel }));

type Tab = 'terminal' | 'files' | 'processes' | 'ports';

export function SandboxPage({ id }: { id: string }) {
  const sandbox = usePolled(({ client }) => client.getSandbox(id), [id]);
  const [tab, setTab] = useState<Tab>('terminal');
  const s = sandbox.data;
  return (
    <section>
      <p className="crumbs"><Link to="/">Sandboxes</Link> / <span className="mono">{id}</span></p>
      <ErrorMessage error={sandbox.error} />
      {s && (
        <>
          <div className="title-row">
            <h2 className="mono">{s.id}</h2>
            <span className={`state state-${s.state}`} data-testid="sandbox-state">{s.state}</span>
          </div>
          <dl className="facts">
            <div><dt>Image</dt><dd>{s.image}</dd></div>
            <div><dt>Size</dt><dd>{s.cpu} CPU · {s.memoryMiB} MiB{s.diskGiB ? ` · ${s.diskGiB} GiB` : ''}</dd></div>
            <div><dt>Egress</dt><dd>{s.egress?.mode ?? '—'}</dd></div>
            <div><dt>Age</dt><dd>{age(s.createdAt)}</dd></div>
            <div><dt>Expires</dt><dd>{s.expiresAt ? new Date(s.expiresAt).toLocaleString() : 'never'}</dd></div>
            <div><dt>Labels</dt><dd><Labels labels={s.labels} /></dd></div>
            {s.forkedFrom && <div><dt>Forked from</dt><dd><Link to={`/sandboxes/${s.forkedFrom}`} className="mono">{s.forkedFrom}</Link></dd></div>}
          </dl>
          {s.errorMessage && <p className="error">{s.errorMessage}</p>}
          <Actions sandbox={s} onChange={sandbox.reload} />
          <div className="tabs" role="tablist">
            {(['terminal', 'files', 'processes', 'ports'] as Tab[]).map((t) => (
              <button key={t} type="button" role="tab" aria-selected={tab === t} className={tab === t ? 'tab active' : 'tab'} onClick={() => setTab(t)}>{t[0].toUpperCase() + t.slice(1)}</button>
            ))}
          </div>
          {/* Kept mounted while another tab shows, so the shell and its screen survive a look at the files. */}
          <div hidden={tab !== 'terminal'}>
            <Suspense fallback={<p className="muted">Loading the terminal…</p>}><TerminalPanel sandboxId={s.id} running={s.state === 'running'} /></Suspense>
          </div>
          {tab === 'files' && (s.state === 'running' ? <Files sandboxId={s.id} /> : <p className="muted">Files can be browsed while the sandbox runs.</p>)}
          {tab === 'processes' && (s.state === 'running' ? <Processes sandboxId={s.id} /> : <p className="muted">Processes are listed while the sandbox runs.</p>)}
          {tab === 'ports' && <Ports sandboxId={s.id} />}
        </>
      )}
    </section>
  );
}

function Actions({ sandbox, onChange }: { sandbox: Sandbox; onChange: () => Promise<void> }) {
  const { client } = useApi();
  const action = useAction();
  const id = sandbox.id;
  const act = (fn: () => Promise<unknown>) => action.run(async () => {
    await fn();
    await onChange();
  });
  const st = sandbox.state;
  return (
    <>
      <div className="actions">
        <button type="button" disabled={action.busy || st !== 'running'} onClick={() => act(() => client.stopSandbox(id))}>Stop</button>
        <button type="button" disabled={action.busy || st !== 'stopped'} onClick={() => act(() => client.resumeSandbox(id))}>Resume</button>
        <button type="button" disabled={action.busy || st !== 'running'} onClick={() => act(() => client.pauseSandbox(id))}>Pause</button>
        <button type="button" disabled={action.busy || st !== 'paused'} onClick={() => act(() => client.unpauseSandbox(id))}>Unpause</button>
        <button type="button" disabled={action.busy} onClick={() => action.run(async () => {
          const fork = await client.forkSandbox(id);
          navigate(`/sandboxes/${encodeURIComponent(fork.sandboxes[0].id)}`);
        })}>Fork</button>
        <button type="button" disabled={action.busy} onClick={() => {
          const name = window.prompt('Snapshot name', `${id}-${new Date().toISOString().slice(0, 19).replace(/[:T]/g, '-')}`);
          if (name) void action.run(async () => {
            await client.createSnapshot(id, name);
            navigate('/snapshots');
          });
        }}>Snapshot</button>
        <button type="button" className="danger" disabled={action.busy} onClick={() => {
          if (window.confirm(`Delete sandbox ${id}? Its files are gone for good.`)) void action.run(async () => {
            await client.deleteSandbox(id);
            navigate('/');
          });
        }}>Delete</button>
      </div>
      <ErrorMessage error={action.error} />
    </>
  );
}

function joinPath(dir: string, name: string): string {
  return `${dir.replace(/\/+$/, '')}/${name}`;
}

function parentOf(path: string): string {
  const trimmed = path.replace(/\/+$/, '');
  const cut = trimmed.lastIndexOf('/');
  return cut <= 0 ? '/' : trimmed.slice(0, cut);
}

function Files({ sandboxId }: { sandboxId: string }) {
  const { client } = useApi();
  const [dir, setDir] = useState('/root');
  const [typed, setTyped] = useState('/root');
  const list = usePolled(({ client }) => client.listFiles(sandboxId, dir), [sandboxId, dir], 0);
  const action = useAction();
  const go = (path: string) => {
    setDir(path);
    setTyped(path);
  };
  const upload = async (event: ChangeEvent<HTMLInputElement>) => {
    const input = event.target;
    const files = [...(input.files ?? [])];
    await action.run(async () => {
      for (const file of files) await client.uploadFile(sandboxId, joinPath(dir, file.name), file);
    });
    input.value = '';
    await list.reload();
  };
  const download = (path: string, name: string) => action.run(async () => {
    // Through fetch with the key in a header, then handed to the browser as a blob URL: a plain
    // link would need the key in the URL.
    const response = await client.downloadFile(sandboxId, path);
    const url = URL.createObjectURL(await response.blob());
    const a = document.createElement('a');
    a.href = url;
    a.download = name;
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  });
  const remove = (path: string, isDir: boolean) => {
    if (!window.confirm(`Delete ${path}${isDir ? ' and everything in it' : ''}?`)) return;
    void action.run(async () => {
      await client.deleteFile(sandboxId, path, isDir);
      await list.reload();
    });
  };
  const entries = [...(list.data ?? [])].sort((a, b) => Number(b.type === 'dir') - Number(a.type === 'dir') || a.name.localeCompare(b.name));
  return (
    <div className="panel">
      <form className="path-bar" onSubmit={(e: FormEvent) => { e.preventDefault(); go(typed.trim() || '/'); }}>
        <button type="button" className="secondary" disabled={dir === '/'} onClick={() => go(parentOf(dir))} aria-label="Parent directory">↑</button>
        <input name="path" value={typed} onChange={(e) => setTyped(e.target.value)} aria-label="Directory" />
        <button type="submit" className="secondary">Open</button>
        <label className="button">
          Upload
          <input type="file" name="upload" multiple onChange={upload} hidden />
        </label>
      </form>
      <ErrorMessage error={list.error ?? action.error} />
      {list.data && (entries.length === 0 ? <p className="muted">Empty directory.</p> : (
        <table className="list files" data-testid="files">
          <thead><tr><th>Name</th><th>Size</th><th>Modified</th><th /></tr></thead>
          <tbody>
            {entries.map((f) => (
              <tr key={f.path}>
                <td data-label="Name">
                  {f.type === 'dir'
                    ? <button type="button" className="link" onClick={() => go(f.path)}>{f.name}/</button>
                    : <span className="mono">{f.name}{f.type === 'symlink' ? ` → ${f.symlinkTarget ?? ''}` : ''}</span>}
                </td>
                <td data-label="Size">{f.type === 'dir' ? '—' : bytes(f.size)}</td>
                <td data-label="Modified">{new Date(f.mtime).toLocaleString()}</td>
                <td className="row-actions">
                  {f.type === 'file' && <button type="button" className="secondary" onClick={() => download(f.path, f.name)}>Download</button>}
                  <button type="button" className="danger" onClick={() => remove(f.path, f.type === 'dir')}>Delete</button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      ))}
    </div>
  );
}

function Processes({ sandboxId }: { sandboxId: string }) {
  const { client } = useApi();
  const list = usePolled(({ client }) => client.listCommands(sandboxId, true), [sandboxId]);
  const [selected, setSelected] = useState<string | null>(null);
  const action = useAction();
  return (
    <div className="panel">
      <ErrorMessage error={list.error ?? action.error} />
      {list.data && (list.data.length === 0 ? <p className="muted">No processes.</p> : (
        <table className="list">
          <thead><tr><th>Process</th><th>Command</th><th>Status</th><th>Started</th><th /></tr></thead>
          <tbody>
            {list.data.map((p) => (
              <tr key={p.processId}>
                <td data-label="Process" className="mono">{p.processId}{p.tag ? ` (${p.tag})` : ''}</td>
                <td data-label="Command" className="mono">{[p.cmd, ...p.args].join(' ')}</td>
                <td data-label="Status">{p.status}{p.exitCode !== null ? ` (${p.exitCode})` : p.signal ? ` (${p.signal})` : ''}</td>
                <td data-label="Started">{age(p.startedAt)} ago</td>
                <td className="row-actions">
                  <button type="button" className="secondary" onClick={() => setSelected(selected === p.processId ? null : p.processId)}>{selected === p.processId ? 'Hide logs' : 'Logs'}</button>
                  {p.status === 'running' && <button type="button" className="danger" onClick={() => action.run(async () => { await client.killCommand(sandboxId, p.processId); await list.reload(); })}>Kill</button>}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      ))}
      {selected && <ProcessLogs sandboxId={sandboxId} processId={selected} />}
    </div>
  );
}

function ProcessLogs({ sandboxId, processId }: { sandboxId: string; processId: string }) {
  // Polled while shown: the output so far (the guest keeps a bounded tail of each stream).
  const logs = usePolled(({ client }) => client.getCommandLogs(sandboxId, processId), [sandboxId, processId]);
  const decode = (text: string) => logs.data?.encoding === 'base64' ? new TextDecoder().decode(Uint8Array.from(atob(text), (c) => c.charCodeAt(0))) : text;
  return (
    <div className="logs">
      <h3>Logs of <span className="mono">{processId}</span></h3>
      <ErrorMessage error={logs.error} />
      {logs.data && (
        <>
          <pre className="log" aria-label="stdout">{decode(logs.data.stdout) || '(no stdout)'}</pre>
          {logs.data.stderr && <pre className="log stderr" aria-label="stderr">{decode(logs.data.stderr)}</pre>}
        </>
      )}
    </div>
  );
}

/**
 * A private port's link with its token (`?_token=`, the proxy's way in; it answers with a cookie).
 * The API gives the token only in the publish answer, so only ports published on this page have one.
 */
function withToken(url: string, token: string | undefined): string {
  if (!token) return url;
  const u = new URL(url, window.location.origin);
  u.searchParams.set('_token', token);
  return u.toString();
}

function Ports({ sandboxId }: { sandboxId: string }) {
  const { client } = useApi();
  const list = usePolled(({ client }) => client.listPorts(sandboxId), [sandboxId]);
  const action = useAction();
  const [port, setPort] = useState('8080');
  const [isPublic, setPublic] = useState(false);
  const [tokens, setTokens] = useState<Record<number, string>>({});
  const publish = (event: FormEvent) => {
    event.preventDefault();
    void action.run(async () => {
      const published = await client.publishPort(sandboxId, Number(port), isPublic);
      const token = published.token;
      if (token) setTokens((known) => ({ ...known, [published.port]: token }));
      await list.reload();
    });
  };
  return (
    <div className="panel">
      <form className="inline-form" onSubmit={publish}>
        <label>Port<input name="port" type="number" min="1" max="65535" value={port} onChange={(e) => setPort(e.target.value)} /></label>
        <label className="inline"><input type="checkbox" checked={isPublic} onChange={(e) => setPublic(e.target.checked)} />Public (no token)</label>
        <button type="submit" disabled={action.busy}>Publish</button>
      </form>
      <ErrorMessage error={list.error ?? action.error} />
      {list.data && (list.data.length === 0 ? <p className="muted">No published ports.</p> : (
        <table className="list">
          <thead><tr><th>Port</th><th>Link</th><th>Access</th><th /></tr></thead>
          <tbody>
            {list.data.map((p) => (
              <tr key={p.port}>
                <td data-label="Port">{p.port}</td>
                <td data-label="Link" className="wrap"><a href={withToken(p.pathUrl, tokens[p.port])} target="_blank" rel="noreferrer">{p.pathUrl}</a>{p.url !== p.pathUrl && <> · <a href={withToken(p.url, tokens[p.port])} target="_blank" rel="noreferrer">host form</a></>}</td>
                <td data-label="Access">{p.public ? 'public' : tokens[p.port] ? 'token (in the link)' : 'token (given when published)'}</td>
                <td className="row-actions"><button type="button" className="danger" onClick={() => action.run(async () => { await client.unpublishPort(sandboxId, p.port); await list.reload(); })}>Unpublish</button></td>
              </tr>
            ))}
          </tbody>
        </table>
      ))}
    </div>
  );
}

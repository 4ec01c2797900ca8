import { age, bytes, ErrorMessage, useAction, useApi, usePolled } from '../hooks.tsx';
import { Link, navigate } from '../router.tsx';

export function SnapshotsPage() {
  const { client } = useApi();
  const list = usePolled(({ client }) => client.listSnapshots(), []);
  const action = useAction();
  return (
    <section>
      <h2>Snapshots</h2>
      <ErrorMessage error={list.error ?? action.error} />
      {list.data === undefined ? <p className="muted">Loading…</p> : list.data.length === 0 ? <p className="muted">No snapshots. Take one from a sandbox's page.</p> : (
        <table className="list">
          <thead><tr><th>Name</th><th>State</th><th>From</th><th>Size</th><th>Age</th><th /></tr></thead>
          <tbody>
            {list.data.map((s) => (
              <tr key={s.id}>
                <td data-label="Name"><span className="mono">{s.name}</span></td>
                <td data-label="State"><span className={`state state-${s.state}`}>{s.state}</span></td>
                <td data-label="From">{s.sourceSandboxId ? <Link to={`/sandboxes/${s.sourceSandboxId}`} className="mono">{s.sourceSandboxId}</Link> : '—'}</td>
                <td data-label="Size">{bytes(s.sizeBytes)}</td>
                <td data-label="Age">{age(s.createdAt)}</td>
                <td className="row-actions">
                  <button type="button" disabled={action.busy || s.state !== 'ready'} onClick={() => action.run(async () => {
                    const sandbox = await client.createSandbox({ snapshot: s.id });
                    navigate(`/sandboxes/${encodeURIComponent(sandbox.id)}`);
                  })}>New sandbox</button>
                  <button type="button" className="danger" disabled={action.busy} onClick={() => {
                    if (window.confirm(`Delete snapshot ${s.name}?`)) void action.run(async () => { await client.deleteSnapshot(s.id); await list.reload(); });
                  }}>Delete</button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

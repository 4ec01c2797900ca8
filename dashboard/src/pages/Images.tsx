import { age, bytes, ErrorMessage, usePolled } from '../hooks.tsx';

/** Built-in images carry the epoch as their creation time: they were never built here. */
function builtIn(createdAt: unknown): boolean {
  return typeof createdAt === 'string' && Date.parse(createdAt) <= 0;
}

export function ImagesPage() {
  const list = usePolled(({ client }) => client.listImages(), [], 10_000);
  return (
    <section>
      <h2>Images</h2>
      <p className="muted">The built-in images and the ones you build; a sandbox names one as its image (<span className="mono">name</span> or <span className="mono">name:tag</span>).</p>
      <ErrorMessage error={list.error} />
      {list.data === undefined ? <p className="muted">Loading…</p> : list.data.length === 0 ? <p className="muted">No built images.</p> : (
        <table className="list">
          <thead><tr><th>Name</th><th>Tags</th><th>Base</th><th>Size</th><th>Age</th></tr></thead>
          <tbody>
            {list.data.map((i) => (
              <tr key={i.id}>
                <td data-label="Name"><span className="mono">{i.name}</span></td>
                <td data-label="Tags">{(i.tags ?? []).map((t) => <span key={t} className="tag">{t}</span>)}</td>
                <td data-label="Base" className="mono wrap">{typeof i.base === 'string' ? i.base : '—'}</td>
                <td data-label="Size">{bytes(typeof i.sizeBytes === 'number' ? i.sizeBytes : null)}</td>
                <td data-label="Age">{builtIn(i.createdAt) ? 'built in' : age(typeof i.createdAt === 'string' ? i.createdAt : null)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

import { useState, type FormEvent } from 'react';
import type { SandboxState } from '../../../src/client/native-client.ts';
import { age, ErrorMessage, parseLabels, useAction, useApi, usePolled } from '../hooks.tsx';
import { Link, navigate } from '../router.tsx';

const STATES: SandboxState[] = ['creating', 'running', 'stopping', 'stopped', 'starting', 'pausing', 'paused', 'resuming', 'deleting', 'error'];

export function SandboxesPage() {
  const [state, setState] = useState<SandboxState | ''>('');
  const [label, setLabel] = useState('');
  const [creating, setCreating] = useState(false);
  // The label filter is sent as the API's `label=key=value`; an entry being typed without `=` is not sent yet.
  const labels = label.split(',').map((s) => s.trim()).filter((s) => /^[^=]+=/.test(s));
  const list = usePolled(({ client }) => client.listAllSandboxes({ state: state ? [state] : undefined, label: labels.length ? labels : undefined }), [state, labels.join(',')]);
  const now = Date.now();
  return (
    <section>
      <div className="title-row">
        <h2>Sandboxes</h2>
        <button type="button" onClick={() => setCreating(!creating)}>{creating ? 'Close' : 'New sandbox'}</button>
      </div>
      {creating && <CreateSandbox />}
      <div className="filters">
        <label>
          State
          <select name="stateFilter" value={state} onChange={(e) => setState(e.target.value as SandboxState | '')}>
            <option value="">any</option>
            {STATES.map((s) => <option key={s} value={s}>{s}</option>)}
          </select>
        </label>
        <label>
          Labels
          <input name="labelFilter" placeholder="team=ml, env=dev" value={label} onChange={(e) => setLabel(e.target.value)} />
        </label>
      </div>
      <ErrorMessage error={list.error} />
      {list.data === undefined ? <p className="muted">Loading…</p> : list.data.length === 0 ? <p className="muted">No sandboxes.</p> : (
        <table className="list">
          <thead><tr><th>Sandbox</th><th>State</th><th>Image</th><th>Size</th><th>Labels</th><th>Age</th></tr></thead>
          <tbody>
            {list.data.map((s) => (
              <tr key={s.id}>
                <td data-label="Sandbox"><Link to={`/sandboxes/${encodeURIComponent(s.id)}`} className="mono">{s.id}</Link></td>
                <td data-label="State"><span className={`state state-${s.state}`}>{s.state}</span></td>
                <td data-label="Image">{s.image}</td>
                <td data-label="Size">{s.cpu} CPU · {s.memoryMiB} MiB</td>
                <td data-label="Labels"><Labels labels={s.labels} /></td>
                <td data-label="Age">{age(s.createdAt, now)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

export function Labels({ labels }: { labels: Record<string, string> }) {
  const entries = Object.entries(labels);
  if (!entries.length) return <span className="muted">—</span>;
  return <>{entries.map(([k, v]) => <span key={k} className="tag">{k}={v}</span>)}</>;
}

function CreateSandbox() {
  const { client } = useApi();
  const images = usePolled(({ client }) => client.listImages(), [], 0);
  const action = useAction();
  const [image, setImage] = useState('default');
  const [cpu, setCpu] = useState('1');
  const [memory, setMemory] = useState('1024');
  const [labels, setLabels] = useState('');
  const [egress, setEgress] = useState<'deny-all' | 'allow-all'>('allow-all');
  const [formError, setFormError] = useState<string | null>(null);
  const submit = async (event: FormEvent) => {
    event.preventDefault();
    let parsed: Record<string, string>;
    try {
      parsed = parseLabels(labels);
    } catch (err) {
      return setFormError((err as Error).message);
    }
    setFormError(null);
    // Numbers go as typed: the API checks them and names the field when one is out of range.
    await action.run(async () => {
      const sandbox = await client.createSandbox({ image: image.trim() || undefined, cpu: Number(cpu), memoryMiB: Number(memory), labels: parsed, egress: { mode: egress } });
      navigate(`/sandboxes/${encodeURIComponent(sandbox.id)}`);
    });
  };
  const imageNames = new Set<string>(['default']);
  for (const i of images.data ?? []) for (const ref of (i.references as string[] | undefined) ?? [i.name]) imageNames.add(ref);
  return (
    <form className="card grid-form" onSubmit={submit} aria-label="New sandbox">
      <label>Image<input name="image" list="image-names" value={image} onChange={(e) => setImage(e.target.value)} /></label>
      <datalist id="image-names">{[...imageNames].map((n) => <option key={n} value={n} />)}</datalist>
      <label>CPUs<input name="cpu" type="number" value={cpu} onChange={(e) => setCpu(e.target.value)} /></label>
      <label>Memory (MiB)<input name="memoryMiB" type="number" value={memory} onChange={(e) => setMemory(e.target.value)} /></label>
      <label>Labels<input name="labels" placeholder="key=value, …" value={labels} onChange={(e) => setLabels(e.target.value)} /></label>
      <label>Network egress
        <select name="egress" value={egress} onChange={(e) => setEgress(e.target.value as 'deny-all' | 'allow-all')}>
          <option value="allow-all">allow all</option>
          <option value="deny-all">deny all</option>
        </select>
      </label>
      <div className="form-actions">
        <button type="submit" disabled={action.busy}>{action.busy ? 'Creating…' : 'Create'}</button>
      </div>
      <ErrorMessage error={formError ?? action.error} />
    </form>
  );
}

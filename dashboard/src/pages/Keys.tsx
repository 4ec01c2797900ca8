import { useState, type FormEvent } from 'react';
import type { ApiKeyPreset, CreatedApiKey } from '../../../src/client/native-client.ts';
import { age, ErrorMessage, useAction, useApi, usePolled } from '../hooks.tsx';

const PRESETS: ApiKeyPreset[] = ['read-only', 'sandbox', 'ci', 'admin'];

export function KeysPage() {
  const { client } = useApi();
  const list = usePolled(({ client }) => client.listApiKeys(), [], 10_000);
  const action = useAction();
  const [name, setName] = useState('');
  const [preset, setPreset] = useState<ApiKeyPreset>('sandbox');
  const [created, setCreated] = useState<CreatedApiKey | null>(null);
  const create = (event: FormEvent) => {
    event.preventDefault();
    void action.run(async () => {
      setCreated(await client.createApiKey({ name: name.trim(), preset }));
      setName('');
      await list.reload();
    });
  };
  return (
    <section>
      <h2>API keys</h2>
      <form className="card inline-form" onSubmit={create} aria-label="New API key">
        <label>Name<input name="keyName" value={name} onChange={(e) => setName(e.target.value)} required /></label>
        <label>Preset
          <select name="preset" value={preset} onChange={(e) => setPreset(e.target.value as ApiKeyPreset)}>
            {PRESETS.map((p) => <option key={p} value={p}>{p}</option>)}
          </select>
        </label>
        <button type="submit" disabled={action.busy}>Create key</button>
      </form>
      {created && (
        <div className="card created-key" role="status">
          <p>The key <strong>{created.name}</strong>. Copy it now: it is shown only this once.</p>
          <code className="secret" data-testid="created-key">{created.key}</code>
          <div className="actions">
            <button type="button" className="secondary" onClick={() => void navigator.clipboard?.writeText(created.key)}>Copy</button>
            <button type="button" className="secondary" onClick={() => setCreated(null)}>Done</button>
          </div>
        </div>
      )}
      <ErrorMessage error={list.error ?? action.error} />
      {list.data && (
        <table className="list" data-testid="keys">
          <thead><tr><th>Name</th><th>Prefix</th><th>Preset</th><th>Last used</th><th>Created</th><th /></tr></thead>
          <tbody>
            {list.data.map((k) => (
              <tr key={k.id} data-key-id={k.id}>
                <td data-label="Name">{k.name}</td>
                <td data-label="Prefix" className="mono">{k.keyPrefix}…</td>
                <td data-label="Preset">{k.preset}{k.sandboxIds ? ` (${k.sandboxIds.length} sandboxes)` : ''}</td>
                <td data-label="Last used">{k.lastUsedAt ? `${age(k.lastUsedAt)} ago` : 'never'}</td>
                <td data-label="Created">{age(k.createdAt)} ago</td>
                <td className="row-actions">
                  <button type="button" className="danger" disabled={action.busy} onClick={() => {
                    if (window.confirm(`Revoke the key "${k.name}" (${k.keyPrefix}…)? Anything using it stops working.`)) {
                      void action.run(async () => { await client.deleteApiKey(k.id); await list.reload(); });
                    }
                  }}>Revoke</button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

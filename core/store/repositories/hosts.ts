import type { DbOrTx } from '../db.js';
import type { HostRecord } from '../../types.js';

interface HostRow {
  id: string;
  url: string;
  driver: string;
  capabilities: Record<string, unknown> | string;
  registered_at: Date | string;
  last_heartbeat_at: Date | string;
}

const fromRow = (r: HostRow): HostRecord => ({
  id: r.id,
  url: r.url,
  driver: r.driver,
  capabilities: typeof r.capabilities === 'string' ? JSON.parse(r.capabilities) : r.capabilities,
  registeredAt: new Date(r.registered_at),
  lastHeartbeatAt: new Date(r.last_heartbeat_at),
});

export function hostRepository(db: DbOrTx) {
  return {
    async upsertHeartbeat(h: { id: string; url: string; driver: string; capabilities: Record<string, unknown> }, now: Date): Promise<HostRecord> {
      const [row] = await db<HostRow>('hosts')
        .insert({ id: h.id, url: h.url, driver: h.driver, capabilities: JSON.stringify(h.capabilities), registered_at: now, last_heartbeat_at: now })
        .onConflict('id')
        .merge({ url: h.url, driver: h.driver, capabilities: JSON.stringify(h.capabilities), last_heartbeat_at: now })
        .returning('*');
      return fromRow(row as HostRow);
    },
    async findById(id: string): Promise<HostRecord | undefined> {
      const row = await db<HostRow>('hosts').where({ id }).first();
      return row ? fromRow(row as HostRow) : undefined;
    },
    async listAlive(since: Date): Promise<HostRecord[]> {
      const rows = await db<HostRow>('hosts').where('last_heartbeat_at', '>=', since).orderBy('id');
      return (rows as HostRow[]).map(fromRow);
    },
  };
}

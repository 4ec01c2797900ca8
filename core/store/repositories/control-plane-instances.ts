import type { DbOrTx } from '../db.js';

export function controlPlaneInstanceRepository(db: DbOrTx) {
  return {
    async heartbeat(id: string, now: Date): Promise<void> {
      await db('control_plane_instances').insert({ id, started_at: now, last_seen_at: now }).onConflict('id').merge({ last_seen_at: now });
    },
    async aliveSince(since: Date): Promise<string[]> {
      const rows = (await db('control_plane_instances').select('id').where('last_seen_at', '>=', since)) as { id: string }[];
      return rows.map((r) => r.id);
    },
    async remove(id: string): Promise<void> {
      await db('control_plane_instances').where({ id }).delete();
    },
  };
}

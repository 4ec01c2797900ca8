import type { DbOrTx } from '../db.js';

/**
 * Control-plane instances (replicas) and their heartbeats. Liveness is stamped and judged with
 * the database's clock (`now()`), never a replica's own: replicas on different machines may
 * disagree about the time, and one whose clock ran ahead would otherwise look alive forever
 * (or, running behind, see a live peer as dead and take over its operations).
 */
export function controlPlaneInstanceRepository(db: DbOrTx) {
  return {
    async heartbeat(id: string): Promise<void> {
      await db.raw(`INSERT INTO control_plane_instances (id, started_at, last_seen_at) VALUES (?, now(), now()) ON CONFLICT (id) DO UPDATE SET last_seen_at = now()`, [id]);
    },
    /** Instances that heartbeated within the last `timeoutMs` by the database's clock. */
    async aliveWithin(timeoutMs: number): Promise<string[]> {
      const rows = (await db('control_plane_instances').select('id').whereRaw(`last_seen_at >= now() - make_interval(secs => ?)`, [timeoutMs / 1000])) as { id: string }[];
      return rows.map((r) => r.id);
    },
    async remove(id: string): Promise<void> {
      await db('control_plane_instances').where({ id }).delete();
    },
  };
}

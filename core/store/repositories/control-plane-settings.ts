import type { DbOrTx } from '../db.js';

/** Facts all replicas of one database share (control_plane_settings). */
export function controlPlaneSettingsRepository(db: DbOrTx) {
  return {
    /** Records `value` for `name` unless one is recorded already; answers the recorded one. */
    async agreeOn(name: string, value: string): Promise<string> {
      await db('control_plane_settings').insert({ name, value }).onConflict('name').ignore();
      const row = (await db('control_plane_settings').where({ name }).first('value')) as { value: string };
      return row.value;
    },
  };
}

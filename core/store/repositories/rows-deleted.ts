import type { Knex } from 'knex';

/**
 * How many rows a DELETE removed, the same on PostgreSQL and PGlite. knex's pg client answers
 * `delete()` with the count, but knex-pglite answers it with its result object
 * (`{ rows, rowCount, ... }`): compared with 0 it is never equal, compared with `> 0` never
 * greater, added to a number it becomes a string. RETURNING is plain SQL both honour, so the
 * count is the rows it gives back. `column` is any column of the table (one it surely has).
 */
export async function deleteCounted(query: Knex.QueryBuilder, column = 'id'): Promise<number> {
  const rows = (await query.delete().returning(column)) as unknown[];
  return rows.length;
}

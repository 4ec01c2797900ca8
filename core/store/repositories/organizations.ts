import type { DbOrTx } from '../db.js';
import type { Organization } from '../../types.js';

interface OrganizationRow {
  id: string;
  name: string;
  created_at: Date | string;
}

const fromRow = (r: OrganizationRow): Organization => ({ id: r.id, name: r.name, createdAt: new Date(r.created_at) });

export function organizationRepository(db: DbOrTx) {
  return {
    async insert(org: { id: string; name: string }): Promise<Organization> {
      const [row] = await db<OrganizationRow>('organizations').insert(org).returning('*');
      return fromRow(row as OrganizationRow);
    },
    async findById(id: string): Promise<Organization | undefined> {
      const row = await db<OrganizationRow>('organizations').where({ id }).first();
      return row ? fromRow(row as OrganizationRow) : undefined;
    },
    async findByName(name: string): Promise<Organization | undefined> {
      const row = await db<OrganizationRow>('organizations').where({ name }).orderBy('created_at').first();
      return row ? fromRow(row as OrganizationRow) : undefined;
    },
  };
}

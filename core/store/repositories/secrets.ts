import type { DbOrTx } from '../db.js';
import { deleteCounted } from './rows-deleted.js';

export interface SecretRecord {
  id: string;
  organizationId: string;
  name: string;
  description: string;
  hosts: string[];
  metadata: Record<string, string>;
  /** 1 at create; +1 at every change of the value. */
  version: number;
  createdAt: Date;
  updatedAt: Date;
}

/** A record with its sealed value: only the secret service sees this, to seal or open it. */
export interface SealedSecret extends SecretRecord {
  valueEncrypted: string;
}

/** How a sandbox gets one secret: as an environment variable, a file, or both. */
export interface SecretRef {
  name: string;
  env?: string;
  /** Absolute path in the sandbox; written mode 0400, owned by root. */
  file?: string;
}

export type SecretSortColumn = 'name' | 'created_at' | 'updated_at';

interface SecretRow {
  id: string;
  organization_id: string;
  name: string;
  description: string;
  hosts: string[] | string;
  metadata: Record<string, string> | string;
  value_encrypted: string;
  version: number;
  created_at: Date | string;
  updated_at: Date | string;
}

const json = <T>(v: T | string): T => (typeof v === 'string' ? (JSON.parse(v) as T) : v);

const fromRow = (r: SecretRow): SealedSecret => ({
  id: r.id,
  organizationId: r.organization_id,
  name: r.name,
  description: r.description,
  hosts: json(r.hosts),
  metadata: json(r.metadata),
  version: r.version,
  createdAt: new Date(r.created_at),
  updatedAt: new Date(r.updated_at),
  valueEncrypted: r.value_encrypted,
});

/** Without the sealed value: what may leave the service. */
export const secretRecordOf = ({ valueEncrypted: _sealed, ...record }: SealedSecret): SecretRecord => record;

export function secretRepository(db: DbOrTx) {
  const ofOrganization = (organizationId: string) => db<SecretRow>('secrets').where({ organization_id: organizationId });
  return {
    async count(organizationId: string): Promise<number> {
      const [{ count }] = (await ofOrganization(organizationId).count('id as count')) as { count: string | number }[];
      return Number(count);
    },
    async nameTaken(organizationId: string, name: string): Promise<boolean> {
      return (await ofOrganization(organizationId).where({ name }).first('id')) !== undefined;
    },
    async insert(s: { id: string; organizationId: string; name: string; description: string; hosts: string[]; metadata: Record<string, string>; valueEncrypted: string }): Promise<SealedSecret> {
      const [row] = (await db('secrets')
        .insert({ id: s.id, organization_id: s.organizationId, name: s.name, description: s.description, hosts: JSON.stringify(s.hosts), metadata: JSON.stringify(s.metadata), value_encrypted: s.valueEncrypted })
        .returning('*')) as SecretRow[];
      return fromRow(row!);
    },
    async find(organizationId: string, id: string): Promise<SealedSecret | undefined> {
      const row = (await ofOrganization(organizationId).where({ id }).first()) as SecretRow | undefined;
      return row ? fromRow(row) : undefined;
    },
    /** By id, else by name (an id that is also another secret's name finds the id). */
    async findByIdOrName(organizationId: string, idOrName: string): Promise<SealedSecret | undefined> {
      const row = (await ofOrganization(organizationId)
        .where((q) => q.where({ id: idOrName }).orWhere({ name: idOrName }))
        .orderByRaw('(id = ?) desc', [idOrName])
        .first()) as SecretRow | undefined;
      return row ? fromRow(row) : undefined;
    },
    /** One page, and how many match in all; `nameContains` is matched literally. */
    async page(organizationId: string, q: { nameContains?: string; sort: SecretSortColumn; order: 'asc' | 'desc'; offset: number; limit: number }): Promise<{ rows: SealedSecret[]; total: number }> {
      const base = () => {
        const b = ofOrganization(organizationId);
        if (q.nameContains) b.where('name', 'like', `%${q.nameContains.replace(/[\\%_]/g, (c) => `\\${c}`)}%`);
        return b;
      };
      const [{ count }] = (await base().count('id as count')) as { count: string | number }[];
      const rows = (await base().orderBy(q.sort, q.order).orderBy('id', q.order).offset(q.offset).limit(q.limit).select('*')) as SecretRow[];
      return { rows: rows.map(fromRow), total: Number(count) };
    },
    /** `valueEncrypted` given: the value changes and the version goes up by one. */
    async update(organizationId: string, id: string, patch: { valueEncrypted?: string; description?: string; hosts?: string[]; metadata?: Record<string, string> }): Promise<SealedSecret | undefined> {
      const columns: Record<string, unknown> = { updated_at: new Date() };
      if (patch.valueEncrypted !== undefined) {
        columns.value_encrypted = patch.valueEncrypted;
        columns.version = db.raw('version + 1');
      }
      if (patch.description !== undefined) columns.description = patch.description;
      if (patch.hosts !== undefined) columns.hosts = JSON.stringify(patch.hosts);
      if (patch.metadata !== undefined) columns.metadata = JSON.stringify(patch.metadata);
      const [row] = (await ofOrganization(organizationId).where({ id }).update(columns).returning('*')) as SecretRow[];
      return row ? fromRow(row) : undefined;
    },
    async remove(organizationId: string, id: string): Promise<boolean> {
      return (await deleteCounted(ofOrganization(organizationId).where({ id }))) > 0;
    },
    /** Which of `names` exist in the organisation. */
    async existingNames(organizationId: string, names: string[]): Promise<Set<string>> {
      return new Set(((await ofOrganization(organizationId).whereIn('name', names).select('name')) as { name: string }[]).map((r) => r.name));
    },
    async findByNames(organizationId: string, names: string[]): Promise<SealedSecret[]> {
      return ((await ofOrganization(organizationId).whereIn('name', names).select('*')) as SecretRow[]).map(fromRow);
    },
  };
}

/** Which secrets each sandbox is given (references by name, never values). */
export function sandboxSecretRepository(db: DbOrTx) {
  return {
    async refsOf(sandboxId: string): Promise<SecretRef[] | undefined> {
      const row = (await db('sandbox_secrets').where({ sandbox_id: sandboxId }).first('refs')) as { refs: SecretRef[] | string } | undefined;
      return row ? json(row.refs) : undefined;
    },
    async set(sandbox: { id: string; organizationId: string }, refs: SecretRef[]): Promise<void> {
      await db('sandbox_secrets')
        .insert({ sandbox_id: sandbox.id, organization_id: sandbox.organizationId, refs: JSON.stringify(refs), updated_at: new Date() })
        .onConflict('sandbox_id')
        .merge(['refs', 'updated_at']);
    },
    async clear(sandboxId: string): Promise<void> {
      await db('sandbox_secrets').where({ sandbox_id: sandboxId }).delete();
    },
  };
}

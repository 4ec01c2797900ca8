// User and group names from the sandbox's own /etc/passwd and /etc/group. The agent runs in the
// sandbox's root, so these are the sandbox's accounts, never the host's. Parsed files are cached
// and re-read when their mtime or size changes (a `useradd` in the sandbox shows up at once).
import { stat, readFile } from 'node:fs/promises';
import { validationFailed } from './errors.js';

export interface AccountTable {
  nameById: Map<number, string>;
  idByName: Map<string, number>;
}

interface CachedTable {
  signature: string;
  table: AccountTable;
}

const EMPTY_SIGNATURE = 'missing';

function parseAccountFile(text: string): AccountTable {
  const nameById = new Map<number, string>();
  const idByName = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    // name:password:id:… in both files.
    const fields = line.split(':');
    if (fields.length < 3) continue;
    const [name, , idText] = fields;
    if (!name || !/^\d+$/.test(idText)) continue;
    const id = Number(idText);
    // The first entry wins for both directions, as getpwuid/getpwnam do.
    if (!nameById.has(id)) nameById.set(id, name);
    if (!idByName.has(name)) idByName.set(name, id);
  }
  return { nameById, idByName };
}

export class AccountDirectory {
  private readonly cache = new Map<string, CachedTable>();

  constructor(
    private readonly passwdPath = '/etc/passwd',
    private readonly groupPath = '/etc/group',
  ) {}

  private async load(path: string): Promise<AccountTable> {
    const info = await stat(path).catch(() => undefined);
    const signature = info ? `${info.mtimeMs}:${info.size}:${info.ino}` : EMPTY_SIGNATURE;
    const cached = this.cache.get(path);
    if (cached && cached.signature === signature) return cached.table;
    const text = info ? await readFile(path, 'utf8').catch(() => '') : '';
    const table = parseAccountFile(text);
    this.cache.set(path, { signature, table });
    return table;
  }

  users(): Promise<AccountTable> {
    return this.load(this.passwdPath);
  }

  groups(): Promise<AccountTable> {
    return this.load(this.groupPath);
  }

  async names(uid: number, gid: number): Promise<{ owner: string; group: string }> {
    const [users, groups] = await Promise.all([this.users(), this.groups()]);
    return { owner: users.nameById.get(uid) ?? String(uid), group: groups.nameById.get(gid) ?? String(gid) };
  }

  /** A name or numeric id → the id; an unknown name is a 400 naming `field`. */
  async resolveUser(value: string | number, field = 'owner'): Promise<number> {
    return resolveId(value, await this.users(), field, 'user');
  }

  async resolveGroup(value: string | number, field = 'group'): Promise<number> {
    return resolveId(value, await this.groups(), field, 'group');
  }
}

function resolveId(value: string | number, table: AccountTable, field: string, kind: string): number {
  if (typeof value === 'number') return value;
  // A name wins over its numeric reading, as chown(1) does; then plain digits are an id.
  const byName = table.idByName.get(value);
  if (byName !== undefined) return byName;
  if (/^\d+$/.test(value) && Number(value) <= 0xffffffff) return Number(value);
  throw validationFailed(field, `no such ${kind} in the sandbox: ${JSON.stringify(value)}`);
}

/** One directory per agent: all FileInfo answers share its cache. */
export const sandboxAccounts = new AccountDirectory();

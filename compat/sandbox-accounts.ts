// The Unix accounts a compat layer acts as. E2B runs everything as `user` and Daytona as
// `daytona` (both in Nestbox's default image, host/images/base-image.ts SANDBOX_ACCOUNTS); the
// native API keeps the agent's own user (root). A compat layer picks its vendor's default here
// and hands the account to core's toolbox: processes run as it (`user`), relative file paths are
// resolved against its home by the layer, and files it writes are given to it.
//
// The accounts come from the sandbox's own /etc/passwd, read through the toolbox (it works on a
// stopped sandbox without waking it) and kept a few seconds per sandbox. An image the user
// brought (OCI) may lack the vendor's user: the default then falls back to root, as a Docker
// image without the user would run as root; a user the caller named that does not exist is a 400.
import { posix } from 'node:path';
import type { Readable } from 'node:stream';
import { errors, NestboxError } from '../core/errors.js';
import type { ToolboxPort } from '../core/compat-port.js';
import type { Principal } from '../core/types.js';

export interface SandboxAccount {
  name: string;
  /** Absent when the account database could not be read (then the name is passed on as is). */
  uid?: number;
  gid?: number;
  home: string;
}

export const ROOT_ACCOUNT: SandboxAccount = { name: 'root', uid: 0, gid: 0, home: '/root' };

/** How long a sandbox's /etc/passwd is reused; `useradd` in the sandbox shows up after this. */
const CACHE_MS = 5_000;
const CACHE_MAX_SANDBOXES = 2_000;
const PASSWD_MAX_BYTES = 1024 * 1024;

interface Cached {
  at: number;
  accounts: Map<string, SandboxAccount> | undefined;
}

export class SandboxAccounts {
  private readonly cache = new Map<string, Cached>();

  constructor(
    private readonly toolbox: Pick<ToolboxPort, 'readFile'>,
    private readonly now: () => number = Date.now,
  ) {}

  /**
   * The account `requested` names, or the layer's `vendorDefault` when none was asked for
   * (root when the sandbox has no such account).
   */
  async resolve(principal: Principal, sandboxId: string, requested: string | undefined, vendorDefault: string): Promise<SandboxAccount> {
    const name = requested || vendorDefault;
    if (name === 'root') return ROOT_ACCOUNT;
    let accounts = await this.accountsOf(principal, sandboxId, false);
    // Not found in a copy read earlier: it may have been created since.
    if (accounts && !accounts.has(name)) accounts = await this.accountsOf(principal, sandboxId, true);
    // Unreadable account database (a key without files:read): the conventional home, and the
    // guest agent resolves the name itself when it starts a process.
    if (!accounts) return { name, home: `/home/${name}` };
    const found = accounts.get(name);
    if (found) return found;
    if (!requested) return accounts.get('root') ?? ROOT_ACCOUNT;
    throw errors.validation('user', `no such user in the sandbox: ${name}`);
  }

  private async accountsOf(principal: Principal, sandboxId: string, fresh: boolean): Promise<Map<string, SandboxAccount> | undefined> {
    const cached = this.cache.get(sandboxId);
    if (!fresh && cached && this.now() - cached.at < CACHE_MS) return cached.accounts;
    let accounts: Map<string, SandboxAccount> | undefined;
    try {
      const stream = await this.toolbox.readFile(principal, sandboxId, '/etc/passwd');
      accounts = parsePasswd(await readCapped(stream.body, PASSWD_MAX_BYTES));
    } catch (error) {
      // No such file (a distroless image): no accounts but root's.
      if (error instanceof NestboxError && error.code === 'not_found') accounts = new Map();
      else if (error instanceof NestboxError && error.code === 'forbidden') accounts = undefined;
      else throw error;
    }
    this.cache.delete(sandboxId);
    this.cache.set(sandboxId, { at: this.now(), accounts });
    // Oldest first in a Map: drop the oldest beyond the bound.
    while (this.cache.size > CACHE_MAX_SANDBOXES) this.cache.delete(this.cache.keys().next().value!);
    return accounts;
  }
}

export function parsePasswd(text: string): Map<string, SandboxAccount> {
  const accounts = new Map<string, SandboxAccount>();
  for (const line of text.split('\n')) {
    const fields = line.split(':');
    if (fields.length < 7 || !/^\d+$/.test(fields[2]) || !/^\d+$/.test(fields[3])) continue;
    if (!accounts.has(fields[0])) accounts.set(fields[0], { name: fields[0], uid: Number(fields[2]), gid: Number(fields[3]), home: fields[5] || '/' });
  }
  return accounts;
}

async function readCapped(body: Readable, max: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += (chunk as Buffer).length;
    if (size > max) {
      body.destroy();
      break;
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

const perToolbox = new WeakMap<object, SandboxAccounts>();

/** One account cache per core toolbox (each layer's requests share it). */
export function sandboxAccounts(toolbox: Pick<ToolboxPort, 'readFile'>): SandboxAccounts {
  let accounts = perToolbox.get(toolbox);
  if (!accounts) {
    accounts = new SandboxAccounts(toolbox);
    perToolbox.set(toolbox, accounts);
  }
  return accounts;
}

/** A client's path in the account's home: `~`, `~/x` and relative paths resolve against it. */
export function inHome(path: string, home: string): string {
  if (path === '~') return home;
  const rest = path.startsWith('~/') ? path.slice(2) : path;
  return posix.resolve(home, rest || '.');
}

/**
 * The `owner` a write passes to the toolbox (`<uid>:<gid>`): the agent writes as root and gives
 * the file and every directory it made to the account. Undefined for root, and when the ids are
 * unknown (then giveTo hands the file over by name afterwards).
 */
export function ownerOf(account: SandboxAccount): string | undefined {
  return account.uid !== undefined && account.uid !== 0 ? `${account.uid}:${account.gid ?? account.uid}` : undefined;
}

/** Only where ownerOf had no ids: gives the written file to the account by name. */
export async function giveTo(toolbox: Pick<ToolboxPort, 'changeOwner'>, principal: Principal, sandboxId: string, path: string, account: SandboxAccount): Promise<void> {
  if (account.uid !== undefined) return;
  await toolbox.changeOwner(principal, sandboxId, { path, owner: account.name, group: account.name });
}

// SSH access (issue 19): the short-lived tokens the SSH gateway accepts as a username, and the
// public keys an organisation registers (username = sandbox id). This service decides who an SSH
// connection is; the gateway (src/ssh/gateway.ts) then acts as that principal through the
// toolbox, like any other front door.
//
// Tokens: 32 characters of [A-Za-z0-9] from crypto.randomBytes (Daytona's alphabet without `_`
// and `-`), stored only as a SHA-256, looked up by that hash. A token is minted from an API key
// and acts with that key's scopes as they are at use time, capped at the `sandbox` preset, on its
// one sandbox; it stops working when it expires, is revoked, its key is revoked, its organisation
// is suspended or its sandbox is deleted.
import { createHash, randomBytes } from 'node:crypto';
import ssh2 from 'ssh2';
import type { Db } from '../store/db.js';
import { errors, NestboxError } from '../errors.js';
import { randomId } from '../ids.js';
import type { Principal, Scope } from '../types.js';
import { canSeeSandbox, KEY_PRESETS, requireScope, scopesOfKey } from './auth.js';

const TOKEN_ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';
const TOKEN_LENGTH = 32;
export const SSH_TOKEN_PATTERN = /^[A-Za-z0-9]{32}$/;
/** What an SSH session may ever do: the `sandbox` preset (further cut to the key's scopes for tokens). */
const SSH_CEILING: ReadonlySet<Scope> = new Set(KEY_PRESETS.sandbox);
/** Longest accepted public key line (an RSA 16384-bit key is ~2.8 KB). */
const MAX_PUBLIC_KEY_CHARS = 8192;
const MAX_COMMENT_CHARS = 200;

export interface SshAccessOptions {
  defaultExpiryMinutes: number;
  maxExpiryMinutes: number;
  /** Live (unexpired, unrevoked) tokens one sandbox may have at once. */
  maxTokensPerSandbox: number;
  maxKeysPerOrganization: number;
  /** The gateway's port (0 = no gateway) and what `sshCommand` advertises. */
  port: number;
  publicPort?: number;
  publicHost?: string;
}

export interface SshAccessToken {
  id: string;
  sandboxId: string;
  /** The secret itself: only in the answer that created it. */
  token: string;
  expiresAt: Date;
  createdAt: Date;
  updatedAt: Date;
}

export interface SshPublicKey {
  id: string;
  fingerprint: string;
  keyType: string;
  publicKey: string;
  comment: string;
  createdAt: Date;
}

/** Who an SSH connection is, once authenticated, and the sandbox it may open. */
export interface SshIdentity {
  principal: Principal;
  sandboxId: string;
  /** `token` or `publickey`, for logs. */
  method: 'token' | 'publickey';
}

/** What the service needs of the sandboxes: that the caller can see one (404 otherwise). */
export interface SshSandboxLookup {
  get(principal: Principal, id: string): Promise<{ id: string }>;
}

function hashToken(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

function newToken(): string {
  const out: string[] = [];
  while (out.length < TOKEN_LENGTH) {
    // Rejection sampling: 248 = 4 × 62 keeps every character equally likely.
    for (const byte of randomBytes(TOKEN_LENGTH * 2)) if (byte < 248 && out.length < TOKEN_LENGTH) out.push(TOKEN_ALPHABET[byte % 62]!);
  }
  return out.join('');
}

/** OpenSSH's `SHA256:<unpadded base64>` fingerprint of a key blob. */
export function sshFingerprint(blob: Buffer): string {
  return `SHA256:${createHash('sha256').update(blob).digest('base64').replace(/=+$/, '')}`;
}

/** Parse one `authorized_keys`-style line: type, blob and comment; a field-named 400 otherwise. */
export function parsePublicKeyLine(line: string): { keyType: string; blob: Buffer; comment: string } {
  if (typeof line !== 'string' || line.trim() === '') throw errors.validation('publicKey', 'is required (an OpenSSH public key line, e.g. the contents of id_ed25519.pub)');
  if (line.length > MAX_PUBLIC_KEY_CHARS) throw errors.validation('publicKey', `is longer than ${MAX_PUBLIC_KEY_CHARS} characters`);
  const parsed = ssh2.utils.parseKey(line.trim());
  if (parsed instanceof Error) throw errors.validation('publicKey', `is not an OpenSSH public key (${parsed.message})`);
  const key = Array.isArray(parsed) ? parsed[0] : parsed;
  if (!key || key.isPrivateKey()) throw errors.validation('publicKey', 'must be a public key, never a private one');
  const fields = line.trim().split(/\s+/);
  return { keyType: key.type, blob: key.getPublicSSH() as Buffer, comment: fields.slice(2).join(' ') };
}

interface TokenRow {
  id: string;
  sandbox_id: string;
  organization_id: string;
  api_key_id: string;
  expires_at: Date | string;
  revoked_at: Date | string | null;
  key_preset: string;
  key_scopes: string[] | string;
  key_sandbox_ids: string[] | string | null;
  key_revoked_at: Date | string | null;
  sandbox_state: string | null;
  organization_suspended_at: Date | string | null;
}

interface KeyRow {
  id: string;
  organization_id: string;
  fingerprint: string;
  key_type: string;
  public_key: string;
  comment: string;
  created_at: Date | string;
}

const json = <T>(v: unknown): T => (typeof v === 'string' ? (JSON.parse(v) as T) : (v as T));

function keyOf(r: KeyRow): SshPublicKey {
  return { id: r.id, fingerprint: r.fingerprint, keyType: r.key_type, publicKey: r.public_key, comment: r.comment, createdAt: new Date(r.created_at) };
}

export class SshAccessService {
  constructor(
    private readonly db: Db,
    private readonly sandboxes: SshSandboxLookup,
    private readonly options: SshAccessOptions,
  ) {}

  /** Whether an SSH gateway listens (NESTBOX_SSH_PORT is not 0). */
  get enabled(): boolean {
    return this.options.port !== 0;
  }

  /**
   * The command a client runs: `ssh [-p <port>] <token>@<host>`, the host being
   * NESTBOX_SSH_PUBLIC_HOST or else the host the API request named (`Host` header).
   */
  sshCommand(token: string, requestHost: string | undefined): string {
    const port = this.options.publicPort ?? this.options.port;
    let host = this.options.publicHost;
    if (!host) {
      try {
        host = new URL(`http://${requestHost ?? 'localhost'}`).hostname.replace(/^\[(.*)\]$/, '$1');
      } catch {
        host = 'localhost';
      }
    }
    return port === 22 ? `ssh ${token}@${host}` : `ssh -p ${port} ${token}@${host}`;
  }

  private assertEnabled(): void {
    if (!this.enabled) throw new NestboxError('not_supported', 'SSH access needs the SSH gateway, which this server does not run (NESTBOX_SSH_PORT=0)');
  }

  // ---- tokens -------------------------------------------------------------------------------

  /**
   * A new token for a sandbox the key can see. `revokeEarlier` (Daytona's behaviour) revokes the
   * sandbox's earlier tokens in the same transaction; otherwise a sandbox may hold at most
   * `maxTokensPerSandbox` live ones (429 beyond).
   */
  async createAccess(principal: Principal, sandboxId: string, input: { expiresInMinutes?: number; revokeEarlier?: boolean } = {}): Promise<SshAccessToken> {
    this.assertEnabled();
    if (principal.credentialId !== undefined) throw errors.forbidden('a sandbox credential cannot obtain SSH access; use the API key');
    requireScope(principal, 'sandboxes:exec');
    const minutes = input.expiresInMinutes ?? this.options.defaultExpiryMinutes;
    if (!Number.isInteger(minutes) || minutes < 1 || minutes > this.options.maxExpiryMinutes) {
      throw errors.validation('expiresInMinutes', `must be an integer from 1 to ${this.options.maxExpiryMinutes}`);
    }
    await this.sandboxes.get(principal, sandboxId);
    const token = newToken();
    const now = new Date();
    const row = { id: `ssh${randomId(21)}`, token_hash: hashToken(token), sandbox_id: sandboxId, organization_id: principal.organizationId, api_key_id: principal.keyId, expires_at: new Date(now.getTime() + minutes * 60_000), created_at: now, updated_at: now };
    await this.db.transaction(async (tx) => {
      // One sandbox's token writes take turns (its row locked), so the limit holds under concurrency.
      await tx('sandboxes').where({ id: sandboxId }).forUpdate().first('id');
      const live = tx('ssh_access_tokens').where({ sandbox_id: sandboxId }).whereNull('revoked_at').where('expires_at', '>', now);
      if (input.revokeEarlier) {
        await live.clone().update({ revoked_at: now, updated_at: now });
      } else {
        const count = Number(((await live.clone().count({ n: '*' }).first()) as { n: string | number } | undefined)?.n ?? 0);
        if (count >= this.options.maxTokensPerSandbox) {
          throw errors.quotaExceeded('sshTokensPerSandbox', `sandbox ${sandboxId} already has ${count} live SSH access tokens (at most ${this.options.maxTokensPerSandbox}); revoke some or wait for them to expire`, {
            max: this.options.maxTokensPerSandbox,
            current: count,
            requested: 1,
            retryAfterSeconds: 60,
          });
        }
      }
      await tx('ssh_access_tokens').insert(row);
      // Housekeeping: rows a day past their expiry can never authenticate again.
      await tx('ssh_access_tokens').where('expires_at', '<', new Date(now.getTime() - 86_400_000)).delete();
    });
    return { id: row.id, sandboxId, token, expiresAt: row.expires_at, createdAt: now, updatedAt: now };
  }

  /** Revoke one token of the sandbox (by its value) or, without one, all of them. Returns how many. */
  async revokeAccess(principal: Principal, sandboxId: string, token?: string): Promise<number> {
    requireScope(principal, 'sandboxes:exec');
    await this.sandboxes.get(principal, sandboxId);
    const now = new Date();
    let q = this.db('ssh_access_tokens').where({ sandbox_id: sandboxId, organization_id: principal.organizationId }).whereNull('revoked_at');
    if (token !== undefined) q = q.where({ token_hash: hashToken(token) });
    return q.update({ revoked_at: now, updated_at: now });
  }

  /** Daytona's validate: whether a token of the caller's organisation would open its sandbox now. */
  async validate(principal: Principal, token: string): Promise<{ valid: boolean; sandboxId: string | null }> {
    try {
      const identity = await this.authenticateToken(token);
      if (identity.principal.organizationId !== principal.organizationId || !canSeeSandbox(principal, identity.sandboxId)) return { valid: false, sandboxId: null };
      return { valid: true, sandboxId: identity.sandboxId };
    } catch {
      return { valid: false, sandboxId: null };
    }
  }

  /** The identity a token username stands for; one 401 for every reason (the reason is in the message, never the token). */
  async authenticateToken(token: string): Promise<SshIdentity> {
    if (!SSH_TOKEN_PATTERN.test(token)) throw errors.unauthorized('not an SSH access token');
    const row = (await this.db('ssh_access_tokens as t')
      .join('api_keys as k', 'k.id', 't.api_key_id')
      .leftJoin('sandboxes as s', 's.id', 't.sandbox_id')
      .join('organizations as o', 'o.id', 't.organization_id')
      .where('t.token_hash', hashToken(token))
      .first(
        't.id',
        't.sandbox_id',
        't.organization_id',
        't.api_key_id',
        't.expires_at',
        't.revoked_at',
        'k.preset as key_preset',
        'k.scopes as key_scopes',
        'k.sandbox_ids as key_sandbox_ids',
        'k.revoked_at as key_revoked_at',
        's.state as sandbox_state',
        'o.suspended_at as organization_suspended_at',
      )) as TokenRow | undefined;
    if (!row) throw errors.unauthorized('unknown SSH access token');
    if (row.revoked_at !== null) throw errors.unauthorized('SSH access token was revoked');
    if (new Date(row.expires_at).getTime() <= Date.now()) throw errors.unauthorized('SSH access token has expired');
    if (row.key_revoked_at !== null) throw errors.unauthorized('the API key this SSH access token was obtained with has been revoked');
    if (row.sandbox_state === null || row.sandbox_state === 'deleted') throw errors.unauthorized('the sandbox of this SSH access token was deleted');
    if (row.organization_suspended_at !== null) throw errors.organizationSuspended(row.organization_id);
    const keySandboxes = json<string[] | null>(row.key_sandbox_ids);
    const allowed = keySandboxes === null || keySandboxes.includes(row.sandbox_id);
    const scopes = allowed ? scopesOfKey(row.key_preset, json<Scope[]>(row.key_scopes)).filter((s) => SSH_CEILING.has(s)) : [];
    return {
      method: 'token',
      sandboxId: row.sandbox_id,
      principal: { organizationId: row.organization_id, keyId: row.api_key_id, scopes: new Set(scopes), sandboxIds: new Set([row.sandbox_id]), credentialId: row.id },
    };
  }

  // ---- public keys --------------------------------------------------------------------------

  async listKeys(principal: Principal): Promise<SshPublicKey[]> {
    requireScope(principal, 'keys:manage');
    const rows = (await this.db('ssh_public_keys').where({ organization_id: principal.organizationId }).orderBy('created_at', 'asc').orderBy('id', 'asc')) as KeyRow[];
    return rows.map(keyOf);
  }

  /** Register a public key for the caller's organisation (409 if it is already registered). */
  async addKey(principal: Principal, input: { publicKey: string; comment?: string }): Promise<SshPublicKey> {
    requireScope(principal, 'keys:manage');
    if (principal.credentialId !== undefined) throw errors.forbidden('a sandbox credential cannot register SSH keys; use the API key');
    const { keyType, blob, comment: lineComment } = parsePublicKeyLine(input.publicKey);
    const comment = input.comment ?? lineComment;
    if (typeof comment !== 'string' || comment.length > MAX_COMMENT_CHARS) throw errors.validation('comment', `must be a string of at most ${MAX_COMMENT_CHARS} characters`);
    const fingerprint = sshFingerprint(blob);
    const row: KeyRow = { id: `sshk${randomId(20)}`, organization_id: principal.organizationId, fingerprint, key_type: keyType, public_key: `${keyType} ${blob.toString('base64')}`, comment, created_at: new Date() };
    await this.db.transaction(async (tx) => {
      await tx('organizations').where({ id: principal.organizationId }).forUpdate().first('id');
      const existing = (await tx('ssh_public_keys').where({ organization_id: principal.organizationId }).select('fingerprint')) as { fingerprint: string }[];
      if (existing.some((k) => k.fingerprint === fingerprint)) throw new NestboxError('conflict', `publicKey: the key ${fingerprint} is already registered for this organisation`, { field: 'publicKey', fingerprint });
      if (existing.length >= this.options.maxKeysPerOrganization) {
        throw errors.quotaExceeded('sshKeys', `the organisation already has ${existing.length} SSH keys (at most ${this.options.maxKeysPerOrganization}); delete one first`, {
          max: this.options.maxKeysPerOrganization,
          current: existing.length,
          requested: 1,
          retryAfterSeconds: 60,
        });
      }
      await tx('ssh_public_keys').insert(row);
    });
    return keyOf(row);
  }

  async deleteKey(principal: Principal, id: string): Promise<void> {
    requireScope(principal, 'keys:manage');
    const n = await this.db('ssh_public_keys').where({ id, organization_id: principal.organizationId }).delete();
    if (n === 0) throw errors.notFound('ssh key', id);
  }

  /**
   * The registered key of the organisation owning `sandboxId` whose blob is `blob`, if any: the
   * gateway then verifies the client's signature with it. Another organisation's key, an unknown
   * or deleted sandbox, a suspended organisation: undefined (the gateway refuses).
   */
  async keyForSandbox(sandboxId: string, blob: Buffer): Promise<{ identity: SshIdentity; publicKey: string } | undefined> {
    if (!/^[a-z0-9]{1,32}$/.test(sandboxId)) return undefined;
    const sandbox = (await this.db('sandboxes as s').join('organizations as o', 'o.id', 's.organization_id').where('s.id', sandboxId).whereNot('s.state', 'deleted').first('s.organization_id', 'o.suspended_at')) as
      | { organization_id: string; suspended_at: Date | string | null }
      | undefined;
    if (!sandbox || sandbox.suspended_at !== null) return undefined;
    const key = (await this.db('ssh_public_keys').where({ organization_id: sandbox.organization_id, fingerprint: sshFingerprint(blob) }).first()) as KeyRow | undefined;
    if (!key) return undefined;
    return {
      publicKey: key.public_key,
      identity: {
        method: 'publickey',
        sandboxId,
        principal: { organizationId: sandbox.organization_id, keyId: `ssh-key:${key.id}`, scopes: SSH_CEILING, sandboxIds: new Set([sandboxId]), credentialId: key.id },
      },
    };
  }
}

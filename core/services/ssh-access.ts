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
import { organizationRepository } from '../store/repositories/organizations.js';
import { sshKeyRepository, sshTokenRepository, type SshPublicKeyRecord } from '../store/repositories/ssh-access.js';
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
  /** What the client runs (`sshCommand` below), for the host the create request named. */
  sshCommand: string;
}

/**
 * The answer to a create, the one shape both front doors give: the native `createSshAccess`
 * was modelled on Daytona's `SshAccessDto`, so compat/daytona answers this same object.
 */
export function renderSshAccess(access: SshAccessToken) {
  return {
    id: access.id,
    sandboxId: access.sandboxId,
    token: access.token,
    expiresAt: access.expiresAt.toISOString(),
    createdAt: access.createdAt.toISOString(),
    updatedAt: access.updatedAt.toISOString(),
    sshCommand: access.sshCommand,
  };
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

function keyOf(r: SshPublicKeyRecord): SshPublicKey {
  return { id: r.id, fingerprint: r.fingerprint, keyType: r.keyType, publicKey: r.publicKey, comment: r.comment, createdAt: r.createdAt };
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
  private sshCommand(token: string, requestHost: string | undefined): string {
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
  async createAccess(principal: Principal, sandboxId: string, input: { expiresInMinutes?: number; revokeEarlier?: boolean; requestHost?: string } = {}): Promise<SshAccessToken> {
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
    const record = { id: `ssh${randomId(21)}`, tokenHash: hashToken(token), sandboxId, organizationId: principal.organizationId, apiKeyId: principal.keyId, expiresAt: new Date(now.getTime() + minutes * 60_000), createdAt: now };
    await this.db.transaction(async (tx) => {
      const tokens = sshTokenRepository(tx);
      await tokens.lockSandbox(sandboxId);
      if (input.revokeEarlier) {
        await tokens.revokeLive(sandboxId, now);
      } else {
        const count = await tokens.countLive(sandboxId, now);
        if (count >= this.options.maxTokensPerSandbox) {
          throw errors.quotaExceeded('sshTokensPerSandbox', `sandbox ${sandboxId} already has ${count} live SSH access tokens (at most ${this.options.maxTokensPerSandbox}); revoke some or wait for them to expire`, {
            max: this.options.maxTokensPerSandbox,
            current: count,
            requested: 1,
            retryAfterSeconds: 60,
          });
        }
      }
      await tokens.insert(record);
      // Housekeeping: rows a day past their expiry can never authenticate again.
      await tokens.deleteExpiredBefore(new Date(now.getTime() - 86_400_000));
    });
    return { id: record.id, sandboxId, token, expiresAt: record.expiresAt, createdAt: now, updatedAt: now, sshCommand: this.sshCommand(token, input.requestHost) };
  }

  /** Revoke one token of the sandbox (by its value) or, without one, all of them. Returns how many. */
  async revokeAccess(principal: Principal, sandboxId: string, token?: string): Promise<number> {
    requireScope(principal, 'sandboxes:exec');
    await this.sandboxes.get(principal, sandboxId);
    return sshTokenRepository(this.db).revoke(principal.organizationId, sandboxId, new Date(), token === undefined ? undefined : hashToken(token));
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
    const grant = await sshTokenRepository(this.db).findGrant(hashToken(token));
    if (!grant) throw errors.unauthorized('unknown SSH access token');
    if (grant.revoked) throw errors.unauthorized('SSH access token was revoked');
    if (grant.expiresAt.getTime() <= Date.now()) throw errors.unauthorized('SSH access token has expired');
    if (grant.keyRevoked) throw errors.unauthorized('the API key this SSH access token was obtained with has been revoked');
    if (grant.sandboxState === null || grant.sandboxState === 'deleted') throw errors.unauthorized('the sandbox of this SSH access token was deleted');
    if (grant.organizationSuspended) throw errors.organizationSuspended(grant.organizationId);
    const allowed = grant.keySandboxIds === null || grant.keySandboxIds.includes(grant.sandboxId);
    const scopes = allowed ? scopesOfKey(grant.keyPreset, grant.keyScopes).filter((s) => SSH_CEILING.has(s)) : [];
    return {
      method: 'token',
      sandboxId: grant.sandboxId,
      principal: { organizationId: grant.organizationId, keyId: grant.apiKeyId, scopes: new Set(scopes), sandboxIds: new Set([grant.sandboxId]), credentialId: grant.id },
    };
  }

  // ---- public keys --------------------------------------------------------------------------

  async listKeys(principal: Principal): Promise<SshPublicKey[]> {
    requireScope(principal, 'keys:manage');
    return (await sshKeyRepository(this.db).list(principal.organizationId)).map(keyOf);
  }

  /** Register a public key for the caller's organisation (409 if it is already registered). */
  async addKey(principal: Principal, input: { publicKey: string; comment?: string }): Promise<SshPublicKey> {
    requireScope(principal, 'keys:manage');
    if (principal.credentialId !== undefined) throw errors.forbidden('a sandbox credential cannot register SSH keys; use the API key');
    const { keyType, blob, comment: lineComment } = parsePublicKeyLine(input.publicKey);
    const comment = input.comment ?? lineComment;
    if (typeof comment !== 'string' || comment.length > MAX_COMMENT_CHARS) throw errors.validation('comment', `must be a string of at most ${MAX_COMMENT_CHARS} characters`);
    const fingerprint = sshFingerprint(blob);
    const record: SshPublicKeyRecord = { id: `sshk${randomId(20)}`, organizationId: principal.organizationId, fingerprint, keyType, publicKey: `${keyType} ${blob.toString('base64')}`, comment, createdAt: new Date() };
    await this.db.transaction(async (tx) => {
      // Under the organisation's row lock, so two concurrent adds cannot both pass the cap.
      await organizationRepository(tx).lockById(principal.organizationId);
      const keys = sshKeyRepository(tx);
      const existing = await keys.fingerprints(principal.organizationId);
      if (existing.includes(fingerprint)) throw new NestboxError('conflict', `publicKey: the key ${fingerprint} is already registered for this organisation`, { field: 'publicKey', fingerprint });
      if (existing.length >= this.options.maxKeysPerOrganization) {
        throw errors.quotaExceeded('sshKeys', `the organisation already has ${existing.length} SSH keys (at most ${this.options.maxKeysPerOrganization}); delete one first`, {
          max: this.options.maxKeysPerOrganization,
          current: existing.length,
          requested: 1,
          retryAfterSeconds: 60,
        });
      }
      await keys.insert(record);
    });
    return keyOf(record);
  }

  async deleteKey(principal: Principal, id: string): Promise<void> {
    requireScope(principal, 'keys:manage');
    if (!(await sshKeyRepository(this.db).remove(principal.organizationId, id))) throw errors.notFound('ssh key', id);
  }

  /**
   * The registered key of the organisation owning `sandboxId` whose blob is `blob`, if any: the
   * gateway then verifies the client's signature with it. Another organisation's key, an unknown
   * or deleted sandbox, a suspended organisation: undefined (the gateway refuses).
   */
  async keyForSandbox(sandboxId: string, blob: Buffer): Promise<{ identity: SshIdentity; publicKey: string } | undefined> {
    if (!/^[a-z0-9]{1,32}$/.test(sandboxId)) return undefined;
    const keys = sshKeyRepository(this.db);
    const owner = await keys.ownerOfSandbox(sandboxId);
    if (!owner || owner.suspended) return undefined;
    const key = await keys.findByFingerprint(owner.organizationId, sshFingerprint(blob));
    if (!key) return undefined;
    return {
      publicKey: key.publicKey,
      identity: {
        method: 'publickey',
        sandboxId,
        principal: { organizationId: owner.organizationId, keyId: `ssh-key:${key.id}`, scopes: SSH_CEILING, sandboxIds: new Set([sandboxId]), credentialId: key.id },
      },
    };
  }
}

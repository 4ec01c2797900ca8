import { createHmac, timingSafeEqual } from 'node:crypto';
import type { Db } from '../store/db.js';
import { sandboxCredentialRepository, type SandboxCredentialKind, type SandboxCredentialRecord } from '../store/repositories/sandbox-credentials.js';
import { errors } from '../errors.js';
import { randomId } from '../ids.js';
import type { Principal, Scope } from '../types.js';
import { canSeeSandbox, KEY_PRESETS, scopesOfKey } from './auth.js';

export type { SandboxCredentialKind } from '../store/repositories/sandbox-credentials.js';

/** What a per-sandbox credential may ever do: the `sandbox` preset, further cut to its key's scopes. */
const CREDENTIAL_CEILING: ReadonlySet<Scope> = new Set(KEY_PRESETS.sandbox);

/** A credential is only worth handing out if it can do at least one of these. */
const USEFUL_SCOPES: Record<SandboxCredentialKind, readonly Scope[]> = {
  envd: ['files:read', 'files:write', 'sandboxes:exec'],
  'daytona-signing': ['files:read', 'files:write'],
};

/** Signed URLs that name no sandbox are checked against at most this many credentials. */
const MAX_SIGNATURE_CANDIDATES = 10_000;

const ID_LENGTH = 24;
/** `nbxe_` access token, `nbxt_` traffic token: `<prefix><row id>_<mac>`; the mac is 43 base64url characters. */
const TOKEN_PATTERN = /^nbx([et])_([a-z0-9]{24})_([A-Za-z0-9_-]{43})$/;

export type SandboxTokenPurpose = 'access' | 'traffic';

export interface SandboxTokenOptions {
  /** Lifetime of a newly minted credential. */
  ttlSeconds: number;
  /** Longest lifetime a signed URL may ask for; a credential is reused only while it outlives such a URL. */
  signedUrlMaxSeconds: number;
}

export interface EnvdCredential {
  accessToken: string;
  trafficToken: string;
  expiresAt: Date;
}

/** A credential usable for checking a signature: the principal it stands for and its secret. */
export interface SignatureCandidate {
  sandboxId: string;
  principal: Principal;
  secret: string;
  /** Its organisation is suspended: a signature it matches is refused with organization_suspended. */
  organizationSuspended: boolean;
}

/**
 * Credentials minted from an API key for one sandbox (issue 11, finding 2): E2B's envd access and
 * traffic tokens, Daytona's file-URL signing key. Each is a row naming the key and an expiry; the
 * secret is an HMAC of the row id under the master secret, so it is never stored but every
 * replica can recompute it (E2B signed URLs hash the token itself, so checking one needs it).
 *
 * A credential acts with its key's scopes as they are at use time, capped at the `sandbox`
 * preset, on its one sandbox. It stops working when it expires, when its key is revoked, and
 * when its sandbox is deleted.
 */
export class SandboxTokenService {
  constructor(
    private readonly db: Db,
    private readonly masterSecret: string,
    private readonly options: SandboxTokenOptions,
  ) {}

  get signedUrlMaxSeconds(): number {
    return this.options.signedUrlMaxSeconds;
  }

  private mac(purpose: string, id: string): string {
    return createHmac('sha256', this.masterSecret).update(`nestbox-sandbox-credential:v1:${purpose}:${id}`).digest('base64url');
  }

  private envdToken(id: string, purpose: SandboxTokenPurpose): string {
    return `nbx${purpose === 'access' ? 'e' : 't'}_${id}_${this.mac(`envd-${purpose}`, id)}`;
  }

  private signingKey(id: string): string {
    return this.mac('daytona-signing', id);
  }

  /**
   * The caller's credential of `kind` on a sandbox it may see (the caller checked visibility and
   * the sandbox's existence). Reuses the key's newest one while it outlives any signed URL it
   * could sign, so repeated calls (Daytona refetches every 15 s) do not pile up rows. Undefined
   * when the key's scopes leave the credential nothing to do.
   */
  private async issue(principal: Principal, sandboxId: string, kind: SandboxCredentialKind): Promise<string | undefined> {
    // A credential never mints another: only the key itself can (so a token cannot renew itself forever).
    if (principal.credentialId !== undefined) throw errors.forbidden('a sandbox credential cannot obtain further credentials; use the API key');
    if (!canSeeSandbox(principal, sandboxId)) throw errors.notFound('sandbox', sandboxId);
    if (!USEFUL_SCOPES[kind].some((s) => principal.scopes.has(s))) return undefined;
    const repo = sandboxCredentialRepository(this.db);
    const now = Date.now();
    const reusable = await repo.findReusable(sandboxId, principal.keyId, kind, new Date(now + this.options.signedUrlMaxSeconds * 1000));
    if (reusable) return reusable.id;
    const id = randomId(ID_LENGTH);
    await repo.insert({ id, kind, sandboxId, organizationId: principal.organizationId, apiKeyId: principal.keyId, expiresAt: new Date(now + this.options.ttlSeconds * 1000) });
    await repo.deleteExpired(new Date(now)).catch(() => undefined);
    return id;
  }

  /** E2B's envdAccessToken and trafficAccessToken for the key on this sandbox (undefined: the key may do nothing with them). */
  async envdCredential(principal: Principal, sandboxId: string): Promise<EnvdCredential | undefined> {
    const id = await this.issue(principal, sandboxId, 'envd');
    if (!id) return undefined;
    const row = await sandboxCredentialRepository(this.db).find(id);
    return { accessToken: this.envdToken(id, 'access'), trafficToken: this.envdToken(id, 'traffic'), expiresAt: row?.expiresAt ?? new Date() };
  }

  /** Daytona's signing key for the key on this sandbox; 403 when the key may neither read nor write files. */
  async daytonaSigningKey(principal: Principal, sandboxId: string): Promise<string> {
    const id = await this.issue(principal, sandboxId, 'daytona-signing');
    if (!id) throw errors.forbidden('this API key lacks the files:read and files:write scopes a signing key would carry');
    return this.signingKey(id);
  }

  /** Daytona's rotation: every signing key of the sandbox (whoever obtained it) stops working now. */
  async rotateDaytonaSigningKeys(principal: Principal, sandboxId: string): Promise<string> {
    if (!canSeeSandbox(principal, sandboxId)) throw errors.notFound('sandbox', sandboxId);
    await sandboxCredentialRepository(this.db).expireForSandbox(sandboxId, 'daytona-signing', new Date());
    return this.daytonaSigningKey(principal, sandboxId);
  }

  /**
   * The principal an envd token stands for. With `sandboxId` (a routed request) the token must be
   * that sandbox's. Forged, expired, revoked-key or other-sandbox tokens are the same 401; a
   * genuine token of a deleted sandbox says the sandbox is gone (E2B clients then report it as
   * no longer running).
   */
  async authenticate(token: string | undefined, sandboxId: string | undefined, purposes: SandboxTokenPurpose[] = ['access']): Promise<Principal> {
    if (!token) throw errors.unauthorized('missing sandbox access token');
    const m = TOKEN_PATTERN.exec(token);
    const purpose: SandboxTokenPurpose | undefined = m ? (m[1] === 'e' ? 'access' : 'traffic') : undefined;
    if (!m || !purpose || !purposes.includes(purpose) || !constantTimeEqual(token, this.envdToken(m[2], purpose))) throw errors.unauthorized('invalid sandbox access token');
    const row = await sandboxCredentialRepository(this.db).find(m[2]);
    if (!row || row.kind !== 'envd' || (sandboxId !== undefined && row.sandboxId !== sandboxId)) throw errors.unauthorized('invalid sandbox access token');
    if (row.keyRevoked) throw errors.unauthorized('the API key this token was obtained with has been revoked');
    if (row.expiresAt.getTime() <= Date.now()) throw errors.unauthorized('sandbox access token has expired; connect again for a new one');
    if (row.organizationSuspended) throw errors.organizationSuspended(row.organizationId);
    if (row.sandboxState === 'deleted') throw errors.notFound('sandbox', row.sandboxId);
    return this.principalOf(row);
  }

  /**
   * Credentials that may have signed a URL: those of one sandbox, or (a URL that names none) of
   * every sandbox in `sandboxStates`. Only unexpired credentials of unrevoked keys on sandboxes
   * that exist.
   */
  async signatureCandidates(kind: SandboxCredentialKind, opts: { sandboxId?: string; sandboxStates?: string[] }): Promise<SignatureCandidate[]> {
    const rows = await sandboxCredentialRepository(this.db).listUsable(kind, new Date(), { ...opts, limit: MAX_SIGNATURE_CANDIDATES });
    return rows.map((row) => ({
      sandboxId: row.sandboxId,
      principal: this.principalOf(row),
      secret: kind === 'envd' ? this.envdToken(row.id, 'access') : this.signingKey(row.id),
      organizationSuspended: row.organizationSuspended,
    }));
  }

  private principalOf(row: SandboxCredentialRecord): Principal {
    const keyScopes = scopesOfKey(row.keyPreset, row.keyScopes as Scope[]);
    // A key limited to sandboxes that no longer include this one (defensive: key lists do not change today).
    const allowed = row.keySandboxIds === null || row.keySandboxIds.includes(row.sandboxId);
    return {
      organizationId: row.organizationId,
      keyId: row.apiKeyId,
      scopes: new Set(allowed ? keyScopes.filter((s) => CREDENTIAL_CEILING.has(s)) : []),
      sandboxIds: new Set([row.sandboxId]),
      credentialId: row.id,
    };
  }
}

function constantTimeEqual(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import type { Db } from '../store/db.js';
import { sandboxAccessTokenRepository } from '../store/repositories/sandbox-access-tokens.js';
import { errors } from '../errors.js';
import type { Principal } from '../types.js';
import { KEY_PRESETS } from './auth.js';

export type SandboxTokenPurpose = 'access' | 'traffic';

/** Signed URLs that name no sandbox are checked against at most this many live sandboxes. */
const MAX_SIGNATURE_CANDIDATES = 10_000;

/**
 * Per-sandbox tokens: a credential that can act on one sandbox only (the design's "every sandbox
 * gets its own token"; E2B calls it envdAccessToken). The token is an HMAC of the sandbox id
 * under the master secret, so every control-plane replica can hand it out again on connect
 * without storing it; its SHA-256 is stored so a token alone finds its sandbox.
 */
export class SandboxTokenService {
  constructor(
    private readonly db: Db,
    private readonly masterSecret: string,
  ) {}

  tokenFor(sandboxId: string, purpose: SandboxTokenPurpose = 'access'): string {
    return createHmac('sha256', this.masterSecret).update(`nestbox-sandbox-${purpose}-token:${sandboxId}`).digest('base64url');
  }

  /** Make the token findable by hash (called when the token is first handed out). */
  async register(sandboxId: string): Promise<string> {
    const token = this.tokenFor(sandboxId);
    await sandboxAccessTokenRepository(this.db).setHashIfMissing(sandboxId, hashToken(token));
    return token;
  }

  /**
   * The principal a sandbox token stands for: the `sandbox` preset limited to that one sandbox.
   * With `sandboxId` the token must be that sandbox's; without it the stored hash finds it.
   * Every failure is the same 401.
   */
  async authenticate(token: string | undefined, sandboxId: string | undefined, purposes: SandboxTokenPurpose[] = ['access']): Promise<Principal> {
    if (!token) throw errors.unauthorized('missing sandbox access token');
    const repo = sandboxAccessTokenRepository(this.db);
    let owner: { id: string; organizationId: string; deleted: boolean } | undefined;
    if (sandboxId !== undefined) {
      if (purposes.some((p) => constantTimeEqual(token, this.tokenFor(sandboxId, p)))) {
        owner = (await repo.findOwner(sandboxId)) ?? { id: sandboxId, organizationId: '', deleted: true };
      }
    } else if (purposes.includes('access')) {
      owner = await repo.findByHash(hashToken(token));
    }
    if (!owner) throw errors.unauthorized('invalid sandbox access token');
    // A genuine token of a sandbox that is gone: say the sandbox is gone (E2B clients then
    // report it as no longer running), not that the credential is wrong.
    if (owner.deleted) throw errors.notFound('sandbox', owner.id);
    return this.principalFor(owner);
  }

  /** The principal of a sandbox whose ownership was proven another way (a signed URL). */
  principalFor(owner: { id: string; organizationId: string }): Principal {
    return {
      organizationId: owner.organizationId,
      keyId: `sandbox-token:${owner.id}`,
      scopes: new Set(KEY_PRESETS.sandbox),
      sandboxIds: new Set([owner.id]),
    };
  }

  async owner(sandboxId: string): Promise<{ id: string; organizationId: string } | undefined> {
    return sandboxAccessTokenRepository(this.db).findOwner(sandboxId);
  }

  /** Live sandboxes with their tokens, for checking a signature that does not say whose it is. */
  async liveSandboxTokens(): Promise<{ id: string; organizationId: string; token: string }[]> {
    const live = await sandboxAccessTokenRepository(this.db).listLive(MAX_SIGNATURE_CANDIDATES);
    return live.map((s) => ({ ...s, token: this.tokenFor(s.id) }));
  }
}

export function hashToken(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

function constantTimeEqual(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

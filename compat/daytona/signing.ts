// Signed file URLs (daytona.md (c) "Signed file URLs"): the SDK signs
// `v1:files:<METHOD>:<path>:<expires>` with HMAC-SHA256 keyed by the sandbox's signing key and
// sends `v1_<base64url>`; the server verifies it without a bearer token.
//
// A signing key is a credential minted from the API key that fetched it (core/services/
// sandbox-tokens.ts): it expires, dies with its key or its sandbox, and a URL it signs acts with
// that key's scopes for the one operation signed (a read-only key's upload URL is refused).
import { createHmac, timingSafeEqual } from 'node:crypto';
import { errors, NestboxError } from '../../core/errors.js';
import type { Principal, Scope } from '../../core/types.js';
import type { SandboxTokensPort } from '../../core/compat-port.js';

export function fileUrlSignature(key: string, method: string, path: string, expires: string): string {
  return `v1_${createHmac('sha256', key).update(`v1:files:${method}:${path}:${expires}`).digest('base64url')}`;
}

/**
 * `expires` must be unix seconds in the future and at most NESTBOX_SIGNED_URL_MAX_SECONDS ahead.
 * The SDK's `ttlSeconds <= 0` ("never expires", `expires=0`) is refused: no URL lives forever.
 */
export function checkExpiry(expires: string, maxSeconds: number, nowMs = Date.now()): void {
  if (!/^\d{1,12}$/.test(expires)) throw new NestboxError('forbidden', 'expires: must be unix seconds');
  if (expires === '0') throw new NestboxError('forbidden', 'expires: 0 (a URL that never expires) is not accepted; sign with a positive ttlSeconds');
  const now = Math.floor(nowMs / 1000);
  if (Number(expires) < now) throw new NestboxError('forbidden', 'signature: the URL has expired');
  if (Number(expires) > now + maxSeconds) throw new NestboxError('forbidden', `expires: more than ${maxSeconds} seconds ahead (this server's maximum for signed URLs)`);
}

/**
 * The principal of a signed URL: 403 unless `signature` signs (method, path, expires) with a
 * live signing key of this sandbox, has not expired, and its key may do `scope`.
 */
export async function verifySignedFileUrl(sandboxTokens: Pick<SandboxTokensPort, 'signedUrlMaxSeconds' | 'signatureCandidates'>, sandboxId: string, method: string, path: string, expires: string, signature: string, scope: Scope): Promise<Principal> {
  checkExpiry(expires, sandboxTokens.signedUrlMaxSeconds);
  const given = Buffer.from(signature);
  for (const candidate of await sandboxTokens.signatureCandidates('daytona-signing', { sandboxId })) {
    const expected = Buffer.from(fileUrlSignature(candidate.secret, method, path, expires));
    if (expected.length !== given.length || !timingSafeEqual(expected, given)) continue;
    if (candidate.organizationSuspended) throw errors.organizationSuspended(candidate.principal.organizationId);
    if (!candidate.principal.scopes.has(scope)) throw new NestboxError('forbidden', `signature: the API key that signed this URL lacks the ${scope} scope`);
    // The URL does exactly the one operation it was signed for.
    return { ...candidate.principal, scopes: new Set([scope]) };
  }
  throw new NestboxError('forbidden', 'signature: does not match a live signing key of this sandbox, path and expiry');
}

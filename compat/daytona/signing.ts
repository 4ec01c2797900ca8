// Signed file URLs (daytona.md (c) "Signed file URLs"): the SDK signs
// `v1:files:<METHOD>:<path>:<expires>` with HMAC-SHA256 keyed by the sandbox's signing key and
// sends `v1_<base64url>`; the server verifies it without a bearer token.
import { createHmac, timingSafeEqual } from 'node:crypto';
import { NestboxError } from '../../core/errors.js';
import type { Services } from '../../src/services.js';

/**
 * The per-sandbox key is derived from the server's master secret, so no key is stored and every
 * control-plane replica computes the same one. It dies with the sandbox id.
 */
export function signingKeyFor(services: Services, sandboxId: string): string {
  return createHmac('sha256', services.hostSecret).update(`daytona-file-url-signing-key:v1:${sandboxId}`).digest('base64url');
}

export function fileUrlSignature(key: string, method: string, path: string, expires: string): string {
  return `v1_${createHmac('sha256', key).update(`v1:files:${method}:${path}:${expires}`).digest('base64url')}`;
}

/** Throws 403 unless `signature` signs (method, path, expires) for this sandbox and has not expired. */
export function verifySignedFileUrl(services: Services, sandboxId: string, method: string, path: string, expires: string, signature: string): void {
  if (!/^\d+$/.test(expires)) throw new NestboxError('forbidden', 'expires: must be unix seconds');
  const expected = Buffer.from(fileUrlSignature(signingKeyFor(services, sandboxId), method, path, expires));
  const given = Buffer.from(signature);
  if (expected.length !== given.length || !timingSafeEqual(expected, given)) throw new NestboxError('forbidden', 'signature: does not match this sandbox, path and expiry');
  // 0 means the URL never expires (the SDK's ttlSeconds <= 0).
  if (expires !== '0' && Number(expires) < Math.floor(Date.now() / 1000)) throw new NestboxError('forbidden', 'signature: the URL has expired');
}

import { randomBytes } from 'node:crypto';

const ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789';

/**
 * Random lowercase alphanumeric string. Sandbox ids use this alphabet only because E2B host
 * names put the id after a `-` (`<port>-<id>.<domain>`) and interface/namespace names are short.
 */
export function randomId(length: number): string {
  const out: string[] = [];
  // Rejection sampling keeps the distribution uniform (256 is not a multiple of 36).
  while (out.length < length) {
    for (const byte of randomBytes(length * 2)) {
      if (byte < 252 && out.length < length) out.push(ALPHABET[byte % 36]);
    }
  }
  return out.join('');
}

export const newSandboxId = (): string => randomId(20);
export const newOrganizationId = (): string => `org${randomId(16)}`;
export const newApiKeyId = (): string => `key${randomId(16)}`;
export const newOperationId = (): string => `op${randomId(16)}`;

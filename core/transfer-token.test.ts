import { describe, expect, it } from 'vitest';
import { mintTransferToken, verifyTransferToken } from './transfer-token.js';

describe('transfer tokens', () => {
  const grant = { host: 'h1', kind: 'snapshot' as const, id: 'snap1', exp: 2_000 };
  it('verifies with the source host secret until it expires', () => {
    const token = mintTransferToken('secret-h1', grant);
    expect(verifyTransferToken('secret-h1', 'h1', token, 1_000)).toEqual(grant);
    expect(verifyTransferToken('secret-h1', 'h1', token, 2_001)).toBeUndefined();
  });
  it('refuses another host, another secret and a tampered grant', () => {
    const token = mintTransferToken('secret-h1', grant);
    expect(verifyTransferToken('secret-h1', 'h2', token, 1_000)).toBeUndefined();
    expect(verifyTransferToken('secret-h2', 'h1', token, 1_000)).toBeUndefined();
    const forged = `${Buffer.from(JSON.stringify({ ...grant, id: 'other' })).toString('base64url')}.${token.split('.')[1]}`;
    expect(verifyTransferToken('secret-h1', 'h1', forged, 1_000)).toBeUndefined();
    expect(verifyTransferToken('secret-h1', 'h1', 'garbage', 1_000)).toBeUndefined();
  });
});

import { describe, expect, it } from 'vitest';
import { moveClaimHeld } from './host-transfer.js';

describe('move claims', () => {
  const now = new Date('2026-12-02T10:00:00Z');
  it('is held while a target is named and its lease runs', () => {
    expect(moveClaimHeld({ movingToHostId: 'h2', moveLeaseUntil: new Date(now.getTime() + 1) }, now)).toBe(true);
  });
  it('is free with no target, or once the lease ran out (its replica died): a retry takes it over', () => {
    expect(moveClaimHeld({ movingToHostId: null, moveLeaseUntil: null }, now)).toBe(false);
    expect(moveClaimHeld({ movingToHostId: 'h2', moveLeaseUntil: now }, now)).toBe(false);
    expect(moveClaimHeld({ movingToHostId: 'h2', moveLeaseUntil: null }, now)).toBe(false);
  });
});

// Egress policy validation and the IPv4 range arithmetic the front doors translate with.
import { describe, expect, it } from 'vitest';
import { NestboxError } from './errors.js';
import { coversAllIpv4, subtractIpv4, validateEgress } from './egress.js';

const problem = (input: unknown): string => {
  try {
    validateEgress(input);
  } catch (error) {
    expect(error).toBeInstanceOf(NestboxError);
    expect((error as NestboxError).code).toBe('validation_failed');
    return (error as NestboxError).message;
  }
  throw new Error('accepted');
};

describe('validateEgress', () => {
  it('accepts deny lists with allow-all and allow-list, normalised, and leaves empty lists out', () => {
    expect(validateEgress({ mode: 'allow-all', deny: ['198.51.100.0/24', 'Ads.Example.com.', 'ads.example.com'] })).toEqual({ mode: 'allow-all', deny: ['198.51.100.0/24', 'ads.example.com'] });
    expect(validateEgress({ mode: 'allow-list', allow: ['203.0.113.0/24'], deny: ['203.0.113.9'] })).toEqual({ mode: 'allow-list', allow: ['203.0.113.0/24'], deny: ['203.0.113.9'] });
    expect(validateEgress({ mode: 'allow-all', deny: [] })).toEqual({ mode: 'allow-all' });
    expect(validateEgress({ mode: 'deny-all', deny: [] })).toEqual({ mode: 'deny-all' });
  });

  it('names the field of a bad entry or a deny list where it has no meaning', () => {
    expect(problem({ mode: 'allow-all', deny: ['10.0.0.0/8', '300.1.1.1'] })).toMatch(/^egress\.deny\[1\]: "300\.1\.1\.1" is not a valid IPv4/);
    expect(problem({ mode: 'allow-all', deny: ['10.0.0.0/33'] })).toMatch(/^egress\.deny\[0\]:/);
    expect(problem({ mode: 'allow-list', allow: ['example.com'], deny: ['2001:db8::/32'] })).toMatch(/^egress\.deny\[0\]: .*IPv6/);
    expect(problem({ mode: 'allow-all', deny: ['*.example.com'] })).toMatch(/^egress\.deny\[0\]: .*wildcard/);
    expect(problem({ mode: 'allow-all', deny: ['not a name'] })).toMatch(/^egress\.deny\[0\]: .*neither/);
    expect(problem({ mode: 'allow-all', deny: 'example.com' })).toMatch(/^egress\.deny: must be an array/);
    expect(problem({ mode: 'deny-all', deny: ['10.0.0.0/8'] })).toMatch(/^egress\.deny: is not allowed with mode "deny-all"/);
    expect(problem({ mode: 'allow-all', deny: Array.from({ length: 257 }, (_, i) => `10.0.${i >> 8}.${i & 255}`) })).toMatch(/^egress\.deny: must have at most 256/);
    expect(problem({ mode: 'allow-all', allow: ['10.0.0.0/8'] })).toMatch(/^egress\.allow: is only allowed/);
    expect(problem({ mode: 'allow-all', block: [] })).toMatch(/^egress\.block: is not a known field/);
  });
});

describe('IPv4 ranges', () => {
  it('cuts exceptions out of a range, as the fewest CIDRs', () => {
    expect(subtractIpv4(['10.0.0.0/8'], ['10.0.0.0/9'])).toEqual(['10.128.0.0/9']);
    expect(subtractIpv4(['198.51.100.0/24'], ['198.51.100.7'])).toEqual([
      '198.51.100.0/30', '198.51.100.4/31', '198.51.100.6', '198.51.100.8/29', '198.51.100.16/28', '198.51.100.32/27', '198.51.100.64/26', '198.51.100.128/25',
    ]);
    expect(subtractIpv4(['198.51.100.7'], ['198.51.100.0/24'])).toEqual([]);
    expect(subtractIpv4(['198.51.100.7', '203.0.113.0/24'], ['192.0.2.0/24'])).toEqual(['198.51.100.7', '203.0.113.0/24']);
    // Overlapping inputs come out once; a host-bits CIDR counts as its network.
    expect(subtractIpv4(['10.0.0.0/8', '10.1.2.3/16'], [])).toEqual(['10.0.0.0/8']);
    expect(subtractIpv4(['0.0.0.0/0'], ['128.0.0.0/1'])).toEqual(['0.0.0.0/1']);
    expect(subtractIpv4(['0.0.0.0/0'], [])).toEqual(['0.0.0.0/0']);
  });

  it('knows which entries cover every address', () => {
    expect(coversAllIpv4('0.0.0.0/0')).toBe(true);
    expect(coversAllIpv4('10.0.0.0/0')).toBe(true);
    expect(coversAllIpv4('0.0.0.0/1')).toBe(false);
    expect(coversAllIpv4('example.com')).toBe(false);
  });
});

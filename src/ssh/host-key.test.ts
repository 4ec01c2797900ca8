// The gateway's derived host key and the key parsing SSH logins rest on, checked against values
// OpenSSH's own ssh-keygen printed for the same key (seed 32 × 0x07).
import ssh2 from 'ssh2';
import { describe, expect, it } from 'vitest';
import { ed25519OpenSshKey, gatewayHostKey } from './host-key.js';
import { parsePublicKeyLine, sshFingerprint, SSH_TOKEN_PATTERN } from '../../core/services/ssh-access.js';

// `ssh-keygen -y -f <key>` and `ssh-keygen -l -E sha256` of ed25519OpenSshKey(Buffer.alloc(32, 7)).
const PUBLIC = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOpKbGPinFIKvvVQexMuxfmVR3auvr57kkIe6mkURtIs';
const FINGERPRINT = 'SHA256:z/fSv0Z0RZS+Lccbc6ZoOWwt/fbj1VFJGSBKQbo4icE';

describe('the SSH gateway host key', () => {
  it('is an OpenSSH Ed25519 private key whose public half is the one ssh-keygen derives', () => {
    const parsed = ssh2.utils.parseKey(ed25519OpenSshKey(Buffer.alloc(32, 7)));
    if (parsed instanceof Error || Array.isArray(parsed)) throw new Error('not one key');
    expect(parsed.type).toBe('ssh-ed25519');
    expect(parsed.isPrivateKey()).toBe(true);
    expect(`ssh-ed25519 ${(parsed.getPublicSSH() as Buffer).toString('base64')}`).toBe(PUBLIC);
    // It signs what its public half verifies.
    const signature = parsed.sign(Buffer.from('hello'));
    const pub = ssh2.utils.parseKey(PUBLIC);
    if (pub instanceof Error || Array.isArray(pub)) throw new Error('not one key');
    expect(pub.verify(Buffer.from('hello'), signature as Buffer)).toBe(true);
  });

  it('is the same for the same host secret (every replica, every restart) and differs for another', () => {
    expect(gatewayHostKey('secret-a')).toBe(gatewayHostKey('secret-a'));
    expect(gatewayHostKey('secret-a')).not.toBe(gatewayHostKey('secret-b'));
  });
});

describe('SSH public keys and tokens', () => {
  it('parses an authorized_keys line, keeps its comment, and fingerprints it as OpenSSH does', () => {
    const parsed = parsePublicKeyLine(`${PUBLIC} alice@laptop`);
    expect(parsed.keyType).toBe('ssh-ed25519');
    expect(parsed.comment).toBe('alice@laptop');
    expect(sshFingerprint(parsed.blob)).toBe(FINGERPRINT);
  });

  it('refuses what is not a public key, naming the field', () => {
    for (const bad of ['', 'ssh-ed25519 AAAA', 'hello world', ed25519OpenSshKey(Buffer.alloc(32, 1))]) {
      expect(() => parsePublicKeyLine(bad)).toThrow(/publicKey/);
    }
  });

  it('tells tokens (32 of A-Z a-z 0-9) from sandbox ids', () => {
    expect(SSH_TOKEN_PATTERN.test('Xq3kP9mW2rT7vB4nZ8cY1dF6gH5jL0sA')).toBe(true);
    expect(SSH_TOKEN_PATTERN.test('k3v9x2m7q1w8e5r4t6y0')).toBe(false);
    expect(SSH_TOKEN_PATTERN.test('Xq3kP9mW2rT7vB4nZ8cY1dF6gH5jL0s_')).toBe(false);
  });
});

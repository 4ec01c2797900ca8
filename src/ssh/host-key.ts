// The SSH gateway's host key. Every replica and every restart must show the same one, or
// clients' known_hosts entries break: by default it is an Ed25519 key whose seed is an HMAC of
// the host secret (which every replica already shares), written out in OpenSSH's own private key
// format, which ssh2 reads. NESTBOX_SSH_HOST_KEY names a key file instead.
import { createHmac, createPrivateKey, createPublicKey } from 'node:crypto';
import { readFileSync } from 'node:fs';

function sshString(data: Buffer | string): Buffer {
  const body = typeof data === 'string' ? Buffer.from(data) : data;
  const len = Buffer.alloc(4);
  len.writeUInt32BE(body.length);
  return Buffer.concat([len, body]);
}

function uint32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0);
  return b;
}

/** An unencrypted `openssh-key-v1` file holding the Ed25519 key of this 32-byte seed. */
export function ed25519OpenSshKey(seed: Buffer, comment = 'nestbox-ssh-gateway'): string {
  if (seed.length !== 32) throw new Error('an Ed25519 seed is 32 bytes');
  // PKCS#8 wrapping of a raw Ed25519 seed (RFC 8410), so node derives the public half.
  const der = Buffer.concat([Buffer.from('302e020100300506032b657004220420', 'hex'), seed]);
  const priv = createPrivateKey({ key: der, format: 'der', type: 'pkcs8' });
  const pub = Buffer.from(createPublicKey(priv).export({ format: 'jwk' }).x as string, 'base64url');
  const blob = Buffer.concat([sshString('ssh-ed25519'), sshString(pub)]);
  const check = seed.readUInt32BE(0);
  let section = Buffer.concat([uint32(check), uint32(check), sshString('ssh-ed25519'), sshString(pub), sshString(Buffer.concat([seed, pub])), sshString(comment)]);
  const pad: number[] = [];
  for (let i = 1; (section.length + pad.length) % 8 !== 0; i++) pad.push(i);
  section = Buffer.concat([section, Buffer.from(pad)]);
  const body = Buffer.concat([Buffer.from('openssh-key-v1\0'), sshString('none'), sshString('none'), sshString(''), uint32(1), sshString(blob), sshString(section)]);
  const lines = body.toString('base64').match(/.{1,70}/g) ?? [];
  return `-----BEGIN OPENSSH PRIVATE KEY-----\n${lines.join('\n')}\n-----END OPENSSH PRIVATE KEY-----\n`;
}

export function gatewayHostKey(hostSecret: string, file?: string): string | Buffer {
  if (file) return readFileSync(file);
  return ed25519OpenSshKey(createHmac('sha256', hostSecret).update('nestbox-ssh-host-key:v1').digest());
}

// Short-lived credentials for host-to-host transfers (snapshot layers, a moved sandbox's disk).
// The receiving host agent pulls from the source host agent; the source must not accept its
// full host secret from a peer (that secret is the control plane's key to everything on it), so
// the control plane mints a token naming what may be read, from which host, until when, signed
// with the SOURCE host's own secret (deriveHostSecret): the source checks it with the secret it
// already holds, no new key to distribute, and any replica can mint one.
import { createHmac, timingSafeEqual } from 'node:crypto';

/** `snapshot`: the snapshot and the parents in its chain; `sandbox`: one stopped sandbox's disk. */
export type TransferKind = 'snapshot' | 'sandbox';

export interface TransferGrant {
  /** The host whose data may be read (the token is signed with its secret). */
  host: string;
  kind: TransferKind;
  id: string;
  /** Expiry, ms since the epoch. */
  exp: number;
}

/** Header the receiving host agent sends the token in (not Authorization: the token is no host secret). */
export const TRANSFER_TOKEN_HEADER = 'x-nestbox-transfer-token';

function sign(hostSecret: string, payload: string): string {
  return createHmac('sha256', hostSecret).update(`nestbox-transfer:${payload}`).digest('base64url');
}

export function mintTransferToken(hostSecret: string, grant: TransferGrant): string {
  const payload = Buffer.from(JSON.stringify(grant)).toString('base64url');
  return `${payload}.${sign(hostSecret, payload)}`;
}

/** The grant, if the token is signed with `hostSecret`, names this host and has not expired. */
export function verifyTransferToken(hostSecret: string, hostId: string, token: string, now = Date.now()): TransferGrant | undefined {
  const dot = token.indexOf('.');
  if (dot <= 0) return undefined;
  const payload = token.slice(0, dot);
  const given = Buffer.from(token.slice(dot + 1));
  const expected = Buffer.from(sign(hostSecret, payload));
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) return undefined;
  let grant: TransferGrant;
  try {
    grant = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as TransferGrant;
  } catch {
    return undefined;
  }
  if (grant.host !== hostId || typeof grant.exp !== 'number' || grant.exp < now) return undefined;
  if ((grant.kind !== 'snapshot' && grant.kind !== 'sandbox') || typeof grant.id !== 'string') return undefined;
  return grant;
}

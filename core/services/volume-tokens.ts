// Credentials for one volume's contents (E2B's volume token, e2b-wave2 §2): minted from an API
// key, they act with that key's volume scopes as they are at use time, on that one volume only,
// and stop working when the key is revoked or the volume deleted. Stateless: the token is
// `nbxv_<volume id>_<key id>_<mac>`, the mac an HMAC of organisation, volume and key under the
// master secret, so every replica checks it and nothing is stored.
import { createHmac, timingSafeEqual } from 'node:crypto';
import type { Db } from '../store/db.js';
import { volumeRepository, volumeTokenKey } from '../store/repositories/volumes.js';
import { errors } from '../errors.js';
import type { Principal, Scope } from '../types.js';
import { scopesOfKey } from './auth.js';

const TOKEN = /^nbxv_(vol[a-z0-9]{17})_(key[a-z0-9]{16})_([A-Za-z0-9_-]{43})$/;
const VOLUME_SCOPES: ReadonlySet<Scope> = new Set(['volumes:read', 'volumes:write']);

export class VolumeTokenService {
  constructor(
    private readonly db: Db,
    private readonly masterSecret: string,
  ) {}

  private mac(organizationId: string, volumeId: string, keyId: string): string {
    return createHmac('sha256', this.masterSecret).update(`nestbox-volume-token:v1:${organizationId}:${volumeId}:${keyId}`).digest('base64url');
  }

  /** A token for the caller's volume; a credential (itself minted from a key) cannot mint one. */
  mint(principal: Principal, volumeId: string): string | undefined {
    if (principal.credentialId !== undefined) return undefined;
    if (!principal.scopes.has('volumes:read')) return undefined;
    return `nbxv_${volumeId}_${principal.keyId}_${this.mac(principal.organizationId, volumeId, principal.keyId)}`;
  }

  /** The principal a token stands for, on `volumeId` only (401 for anything else). */
  async authenticate(token: string | undefined, volumeId: string): Promise<Principal> {
    if (!token) throw errors.unauthorized('missing volume token (Authorization: Bearer <token>)');
    const m = TOKEN.exec(token);
    if (!m || m[1] !== volumeId) throw errors.unauthorized('invalid volume token');
    const key = await volumeTokenKey(this.db, m[2]!);
    if (!key || !constantTimeEqual(m[3]!, this.mac(key.organizationId, m[1]!, m[2]!))) throw errors.unauthorized('invalid volume token');
    if (key.revoked) throw errors.unauthorized('the API key this volume token was obtained with has been revoked');
    if (key.organizationSuspended) throw errors.organizationSuspended(key.organizationId);
    if (!(await volumeRepository(this.db).findLive(key.organizationId, volumeId))) throw errors.notFound('volume', volumeId);
    const scopes = scopesOfKey(key.preset, (Array.isArray(key.scopes) ? key.scopes : []) as Scope[]).filter((s) => VOLUME_SCOPES.has(s));
    return { organizationId: key.organizationId, keyId: m[2]!, scopes: new Set(scopes), sandboxIds: new Set(), credentialId: `volume:${volumeId}` };
  }
}

function constantTimeEqual(a: string, b: string): boolean {
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

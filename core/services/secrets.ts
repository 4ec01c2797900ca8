// Organisation secrets (issue 19): named values an organisation stores once and gives to chosen
// sandboxes as environment variables or files.
//
// At rest a value is only ciphertext: AES-256-GCM under a key derived with HKDF-SHA256 from the
// master host secret (every replica holds the same one), a fresh 96-bit IV per write, the
// secret's id and organisation bound in as additional data (a ciphertext copied to another row
// does not open). No read returns a value and no log line carries one; the only place it is
// decrypted is `deliver`, which hands it to the sandbox's own guest agent.
//
// A sandbox keeps which secrets it gets (`sandbox_secrets`: name plus env name or file path),
// never their values: they are resolved on every create and start, so a secret updated or
// deleted takes effect at the sandbox's next start. Values travel to the guest agent after the
// host agent has started the sandbox (`PUT /env`, a file write), never in the host agent's
// sandbox spec, so the host's records on disk do not hold them either.
import { createCipheriv, createDecipheriv, hkdfSync, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import type { Db, DbOrTx } from '../store/db.js';
import { errors, NestboxError } from '../errors.js';
import { randomId } from '../ids.js';
import type { GuestClient } from '../guest.js';
import type { Logger } from '../logger.js';
import type { Principal, Sandbox } from '../types.js';
import { isTransitional } from '../state-machine.js';
import { requireScope } from './auth.js';
import { organizationRepository } from '../store/repositories/organizations.js';
import { sandboxSecretRepository, secretRecordOf, secretRepository, type SealedSecret, type SecretRecord, type SecretRef, type SecretSortColumn } from '../store/repositories/secrets.js';

export type { SecretRecord, SecretRef } from '../store/repositories/secrets.js';

export interface SecretOptions {
  /** Secrets per organisation (429 limit_reached beyond). */
  maxPerOrganization: number;
  /** Bytes of one value (UTF-8). */
  maxValueBytes: number;
  /** Secrets one sandbox may be given. */
  maxPerSandbox: number;
}

/** What `replaceRefs` needs of SandboxService (declared here: sandboxes.ts imports this module). */
export interface SecretSandboxes {
  get(principal: Principal, id: string): Promise<Sandbox>;
  guestFor(principal: Principal, id: string, operation: string): Promise<GuestClient>;
}

export interface SecretInput {
  name?: unknown;
  value?: unknown;
  description?: unknown;
  hosts?: unknown;
  metadata?: unknown;
}

const SECRET_NAME = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const HOST_PATTERN = /^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$/;
const SORTS: Record<string, SecretSortColumn> = { name: 'name', createdAt: 'created_at', updatedAt: 'updated_at' };

export const newSecretId = (): string => `sec${randomId(20)}`;

/** AES-256-GCM under a key HKDF derives from the master secret; `aad` ties a ciphertext to its row. */
class ValueBox {
  private readonly key: Buffer;
  constructor(masterSecret: string) {
    this.key = Buffer.from(hkdfSync('sha256', masterSecret, 'nestbox', 'nestbox-organization-secrets-v1', 32));
  }
  seal(plain: string, aad: string): string {
    const iv = randomBytes(12);
    const c = createCipheriv('aes-256-gcm', this.key, iv);
    c.setAAD(Buffer.from(aad));
    const body = Buffer.concat([c.update(plain, 'utf8'), c.final()]);
    return ['v1', iv.toString('base64url'), c.getAuthTag().toString('base64url'), body.toString('base64url')].join('.');
  }
  open(sealed: string, aad: string): string {
    const [v, iv, tag, body] = sealed.split('.');
    if (v !== 'v1' || !iv || !tag || body === undefined) throw errors.internal('a secret is not in a format this server wrote');
    const d = createDecipheriv('aes-256-gcm', this.key, Buffer.from(iv, 'base64url'));
    d.setAAD(Buffer.from(aad));
    d.setAuthTag(Buffer.from(tag, 'base64url'));
    return Buffer.concat([d.update(Buffer.from(body, 'base64url')), d.final()]).toString('utf8');
  }
}

export class SecretService {
  private readonly box: ValueBox;
  private sandboxes: SecretSandboxes | undefined;

  constructor(
    private readonly db: Db,
    masterSecret: string,
    readonly opts: SecretOptions,
    private readonly log?: Logger,
  ) {
    this.box = new ValueBox(masterSecret);
  }

  /** The sandboxes whose secrets `replaceRefs` changes (set once by the composition root). */
  useSandboxes(sandboxes: SecretSandboxes): void {
    this.sandboxes = sandboxes;
  }

  // ---- validation -------------------------------------------------------------------------

  private name(raw: unknown, field = 'name'): string {
    if (typeof raw !== 'string' || !SECRET_NAME.test(raw)) throw errors.validation(field, 'must be 1-128 letters, digits, "_", "." or "-", not starting with "." or "-"');
    return raw;
  }

  private value(raw: unknown): string {
    if (typeof raw !== 'string') throw errors.validation('value', 'must be a string');
    if (raw.includes('\0')) throw errors.validation('value', 'must not contain NUL');
    const bytes = Buffer.byteLength(raw, 'utf8');
    if (bytes > this.opts.maxValueBytes) throw errors.validation('value', `must be at most ${this.opts.maxValueBytes} bytes (NESTBOX_SECRET_MAX_VALUE_BYTES), got ${bytes}`);
    return raw;
  }

  private description(raw: unknown): string {
    if (typeof raw !== 'string' || raw.length > 1000) throw errors.validation('description', 'must be a string of at most 1000 characters');
    return raw;
  }

  private hosts(raw: unknown): string[] {
    if (!Array.isArray(raw) || raw.length > 100) throw errors.validation('hosts', 'must be an array of at most 100 host names');
    raw.forEach((h, i) => {
      if (typeof h !== 'string' || h.length > 253 || !HOST_PATTERN.test(h)) throw errors.validation(`hosts[${i}]`, 'must be a host name, optionally starting with "*."');
    });
    return [...new Set(raw as string[])];
  }

  private metadata(raw: unknown): Record<string, string> {
    if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw errors.validation('metadata', 'must be an object of strings');
    const entries = Object.entries(raw as Record<string, unknown>);
    if (entries.length > 32) throw errors.validation('metadata', 'must have at most 32 entries');
    let total = 0;
    for (const [k, v] of entries) {
      if (typeof v !== 'string') throw errors.validation(`metadata.${k}`, 'must be a string');
      if (Buffer.byteLength(k) > 128 || Buffer.byteLength(v) > 1024) throw errors.validation(`metadata.${k}`, 'keys are at most 128 bytes, values 1024');
      total += Buffer.byteLength(k) + Buffer.byteLength(v);
    }
    if (total > 8192) throw errors.validation('metadata', 'must be at most 8192 bytes in all');
    return raw as Record<string, string>;
  }

  // ---- the organisation's secrets -----------------------------------------------------------

  async create(principal: Principal, input: SecretInput): Promise<SecretRecord> {
    requireScope(principal, 'secrets:manage');
    const name = this.name(input.name);
    const value = this.value(input.value);
    const description = input.description === undefined || input.description === null ? '' : this.description(input.description);
    const hosts = input.hosts === undefined || input.hosts === null ? [] : this.hosts(input.hosts);
    const metadata = input.metadata === undefined || input.metadata === null ? {} : this.metadata(input.metadata);
    const id = newSecretId();
    const created = await this.db.transaction(async (tx) => {
      // The cap is checked under a lock on the organisation, so two creates cannot both pass it.
      await organizationRepository(tx).lockById(principal.organizationId);
      const secrets = secretRepository(tx);
      if ((await secrets.count(principal.organizationId)) >= this.opts.maxPerOrganization) throw new NestboxError('limit_reached', `an organisation may have at most ${this.opts.maxPerOrganization} secrets (NESTBOX_SECRET_MAX_PER_ORG)`, { limit: 'secrets', max: this.opts.maxPerOrganization });
      if (await secrets.nameTaken(principal.organizationId, name)) throw new NestboxError('conflict', `name: a secret named "${name}" already exists`, { field: 'name' });
      return secrets.insert({ id, organizationId: principal.organizationId, name, description, hosts, metadata, valueEncrypted: this.box.seal(value, `${principal.organizationId}/${id}`) });
    }).catch((err: unknown) => {
      if (!(err instanceof NestboxError) && /unique|duplicate/i.test(String((err as Error)?.message))) throw new NestboxError('conflict', `name: a secret named "${name}" already exists`, { field: 'name' });
      throw err;
    });
    return secretRecordOf(created);
  }

  private async sealed(principal: Principal, id: string): Promise<SealedSecret> {
    const secret = await secretRepository(this.db).find(principal.organizationId, id);
    if (!secret) throw errors.notFound('secret', id);
    return secret;
  }

  async get(principal: Principal, id: string): Promise<SecretRecord> {
    requireScope(principal, 'secrets:manage');
    return secretRecordOf(await this.sealed(principal, id));
  }

  /** By id, else by name (E2B's `secretID` path parameter takes either). */
  async getByIdOrName(principal: Principal, idOrName: string): Promise<SecretRecord> {
    requireScope(principal, 'secrets:manage');
    const secret = await secretRepository(this.db).findByIdOrName(principal.organizationId, idOrName);
    if (!secret) throw errors.notFound('secret', idOrName);
    return secretRecordOf(secret);
  }

  /** A page of the organisation's secrets; `cursor` is the offset this list gave. */
  async list(principal: Principal, q: { limit?: number; cursor?: string; name?: string; sort?: string; order?: string } = {}): Promise<{ items: SecretRecord[]; nextCursor: string | null; total: number }> {
    requireScope(principal, 'secrets:manage');
    const limit = q.limit ?? 100;
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw errors.validation('limit', 'must be an integer from 1 to 1000');
    const sort = q.sort ?? 'name';
    if (!Object.hasOwn(SORTS, sort)) throw errors.validation('sort', `must be one of ${Object.keys(SORTS).join(', ')}`);
    const order = q.order ?? 'asc';
    if (order !== 'asc' && order !== 'desc') throw errors.validation('order', 'must be asc or desc');
    let offset = 0;
    if (q.cursor !== undefined && q.cursor !== '') {
      const decoded = Buffer.from(q.cursor, 'base64url').toString();
      if (!/^o\d{1,9}$/.test(decoded)) throw errors.validation('cursor', 'is not a cursor this server gave');
      offset = Number(decoded.slice(1));
    }
    const { rows, total } = await secretRepository(this.db).page(principal.organizationId, { nameContains: q.name, sort: SORTS[sort]!, order, offset, limit });
    const next = offset + rows.length < total && rows.length === limit ? Buffer.from(`o${offset + rows.length}`).toString('base64url') : null;
    return { items: rows.map(secretRecordOf), nextCursor: next, total };
  }

  async update(principal: Principal, id: string, input: SecretInput): Promise<SecretRecord> {
    requireScope(principal, 'secrets:manage');
    const current = await this.sealed(principal, id);
    if (input.name !== undefined && input.name !== current.name) throw errors.validation('name', 'cannot be changed (create a new secret)');
    const updated = await secretRepository(this.db).update(principal.organizationId, current.id, {
      valueEncrypted: input.value === undefined ? undefined : this.box.seal(this.value(input.value), `${current.organizationId}/${current.id}`),
      description: input.description === undefined ? undefined : input.description === null ? '' : this.description(input.description),
      hosts: input.hosts === undefined ? undefined : input.hosts === null ? [] : this.hosts(input.hosts),
      metadata: input.metadata === undefined ? undefined : input.metadata === null ? {} : this.metadata(input.metadata),
    });
    if (!updated) throw errors.notFound('secret', id);
    return secretRecordOf(updated);
  }

  /** Sandboxes given it go on without it from their next start (the reference stays, resolved to nothing). */
  async remove(principal: Principal, id: string): Promise<void> {
    requireScope(principal, 'secrets:manage');
    if (!(await secretRepository(this.db).remove(principal.organizationId, id))) throw errors.notFound('secret', id);
  }

  // ---- sandboxes' secrets --------------------------------------------------------------------

  /**
   * Checks what a create (or Daytona's updateSecrets) gives a sandbox: each secret exists in the
   * caller's organisation, env names are valid and not also in `env`, file paths are absolute.
   * Giving a secret to a sandbox is reading it (the sandbox's user can print it), so it takes
   * `secrets:manage` too.
   */
  async validateRefs(principal: Principal, raw: unknown, env: Record<string, string> = {}, field = 'secrets'): Promise<SecretRef[]> {
    if (raw === undefined || raw === null) return [];
    if (!Array.isArray(raw)) throw errors.validation(field, 'must be an array of {name, env?, file?}');
    if (raw.length === 0) return [];
    requireScope(principal, 'secrets:manage');
    if (raw.length > this.opts.maxPerSandbox) throw errors.validation(field, `a sandbox may be given at most ${this.opts.maxPerSandbox} secrets`);
    const refs: SecretRef[] = [];
    const envNames = new Set<string>();
    const files = new Set<string>();
    raw.forEach((item, i) => {
      const f = `${field}[${i}]`;
      if (item === null || typeof item !== 'object' || Array.isArray(item)) throw errors.validation(f, 'must be an object {name, env?, file?}');
      const { name, env: envName, file, ...rest } = item as Record<string, unknown>;
      const extra = Object.keys(rest)[0];
      if (extra !== undefined) throw errors.validation(`${f}.${extra}`, 'is not a field of a secret reference (name, env, file)');
      const ref: SecretRef = { name: this.name(name, `${f}.name`) };
      if (envName !== undefined) {
        if (typeof envName !== 'string' || !ENV_NAME.test(envName)) throw errors.validation(`${f}.env`, 'must be a valid environment variable name');
        if (envName in env) throw errors.validation(`${f}.env`, `${envName} is also in env; give it one way`);
        if (envNames.has(envName)) throw errors.validation(`${f}.env`, `${envName} is given twice`);
        envNames.add(envName);
        ref.env = envName;
      }
      if (file !== undefined) {
        if (typeof file !== 'string' || !file.startsWith('/') || file.length > 1024 || file.includes('\0') || file.split('/').includes('..') || file.endsWith('/')) throw errors.validation(`${f}.file`, 'must be an absolute file path without ".."');
        if (files.has(file)) throw errors.validation(`${f}.file`, `${file} is given twice`);
        files.add(file);
        ref.file = file;
      }
      if (ref.env === undefined && ref.file === undefined) throw errors.validation(f, 'needs env or file (how the sandbox gets the secret)');
      refs.push(ref);
    });
    const names = [...new Set(refs.map((r) => r.name))];
    const found = await secretRepository(this.db).existingNames(principal.organizationId, names);
    const missing = refs.findIndex((r) => !found.has(r.name));
    if (missing >= 0) throw errors.validation(`${field}[${missing}].name`, `no secret named "${refs[missing]!.name}" in this organisation`);
    return refs;
  }

  /** Records what a sandbox is given (in the create's transaction); an empty list removes the record. */
  async attach(db: DbOrTx, sandbox: Pick<Sandbox, 'id' | 'organizationId'>, refs: SecretRef[]): Promise<void> {
    if (refs.length === 0) await sandboxSecretRepository(db).clear(sandbox.id);
    else await sandboxSecretRepository(db).set(sandbox, refs);
  }

  /** A fork's children get what their source was given (in the fork's transaction). */
  async inherit(db: DbOrTx, source: Pick<Sandbox, 'id'>, children: Pick<Sandbox, 'id' | 'organizationId'>[]): Promise<boolean> {
    const refs = await sandboxSecretRepository(db).refsOf(source.id);
    if (!refs) return false;
    for (const child of children) await this.attach(db, child, refs);
    return true;
  }

  async refsOf(sandboxId: string): Promise<SecretRef[]> {
    return (await sandboxSecretRepository(this.db).refsOf(sandboxId)) ?? [];
  }

  /**
   * Replaces what a sandbox is given (Daytona's updateSecrets). A running sandbox's guest gets
   * the change at once for later processes (removed variables unset, removed files deleted);
   * processes already running keep their environment. Otherwise it takes effect at the next start.
   */
  async replaceRefs(principal: Principal, sandboxId: string, raw: unknown, field = 'secrets'): Promise<Sandbox> {
    requireScope(principal, 'secrets:manage');
    if (!this.sandboxes) throw errors.internal('the secret service has no sandboxes');
    const sandbox = await this.sandboxes.get(principal, sandboxId);
    if (isTransitional(sandbox.state)) throw errors.invalidState('sandbox', sandbox.id, sandbox.state, ['running', 'paused', 'stopped', 'error'], 'change the secrets of');
    const guest = sandbox.state === 'running' ? await this.sandboxes.guestFor(principal, sandbox.id, 'change the secrets of') : undefined;
    const refs = await this.validateRefs(principal, raw, sandbox.env, field);
    const before = await this.refsOf(sandbox.id);
    await this.attach(this.db, sandbox, refs);
    if (!guest) return sandbox;
    const gone = before.filter((b) => !refs.some((r) => r.name === b.name && r.env === b.env && r.file === b.file));
    const unset = gone.map((r) => r.env).filter((e): e is string => e !== undefined && !refs.some((r) => r.env === e));
    if (unset.length) await guest.setEnv({ env: {}, unset });
    for (const r of gone) if (r.file && !refs.some((x) => x.file === r.file)) await guest.deleteFile({ path: r.file }).catch(() => undefined);
    await this.deliver(sandbox, guest);
    return sandbox;
  }

  /** The values of `refs`, decrypted: for `deliver` only. A secret deleted since is left out. */
  private async resolve(organizationId: string, refs: SecretRef[]): Promise<Map<string, string>> {
    const secrets = await secretRepository(this.db).findByNames(organizationId, [...new Set(refs.map((r) => r.name))]);
    return new Map(secrets.map((r) => [r.name, this.box.open(r.valueEncrypted, `${r.organizationId}/${r.id}`)]));
  }

  /**
   * Hands a sandbox its secrets, resolved now: env variables into the guest agent's default
   * environment (every later exec, process, session, PTY), files written mode 0400. Run after
   * the host agent has started it, before the create or start answers. A secret deleted since
   * it was given is left out (its variable unset, its file removed; logged by name); a sandbox
   * given none costs one query.
   */
  async deliver(sandbox: Pick<Sandbox, 'id' | 'organizationId'>, guest: GuestClient): Promise<void> {
    const refs = await this.refsOf(sandbox.id);
    if (refs.length === 0) return;
    const values = await this.resolve(sandbox.organizationId, refs);
    const env: Record<string, string> = {};
    const unset: string[] = [];
    for (const ref of refs) {
      const value = values.get(ref.name);
      if (value === undefined) {
        this.log?.warn({ sandboxId: sandbox.id, secretName: ref.name }, 'a secret given to the sandbox no longer exists; it is left out');
        if (ref.env) unset.push(ref.env);
        continue;
      }
      if (ref.env) env[ref.env] = value;
    }
    await guest.setEnv({ env, unset });
    for (const ref of refs) {
      const value = values.get(ref.name);
      if (!ref.file) continue;
      // A deleted secret's file (written at an earlier start, on the kept disk) goes too.
      if (value === undefined) {
        await guest.deleteFile({ path: ref.file }).catch(() => undefined);
        continue;
      }
      const dir = ref.file.slice(0, ref.file.lastIndexOf('/')) || '/';
      await guest.makeDirectory({ path: dir, mode: '755' }).catch(() => undefined);
      await guest.writeFile(ref.file, Readable.from([Buffer.from(value, 'utf8')]), { mode: '400' });
    }
  }
}

import type { Readable } from 'node:stream';
import type { Db } from '../store/db.js';
import { sandboxRepository, type SandboxPatch } from '../store/repositories/sandboxes.js';
import { errors, toNestboxError } from '../errors.js';
import { newOperationId, newSandboxId } from '../ids.js';
import { assertCanBegin, assertRunning, OPERATIONS, type Operation, type SandboxState } from '../state-machine.js';
import type { IncomingMessage } from 'node:http';
import type { AgentRequest, AgentWebSocketTarget, ExecInput, ExecResult, FileDownload, FileEntry, HostClient, HostSandboxSpec } from '../host-client.js';
import type { Principal, Sandbox, Scope } from '../types.js';
import { canSeeSandbox, requireScope } from './auth.js';
import type { HostService } from './hosts.js';

export interface SandboxLimits {
  defaultImage: string;
  defaultCpu: number;
  maxCpu: number;
  defaultMemoryMiB: number;
  minMemoryMiB: number;
  maxMemoryMiB: number;
  defaultTimeoutSeconds: number;
  maxTimeoutSeconds: number;
  maxListLimit: number;
}

export interface CreateSandboxInput {
  image?: string;
  cpu?: number;
  memoryMiB?: number;
  env?: Record<string, string>;
  labels?: Record<string, string>;
  timeoutSeconds?: number;
}

export interface UpdateSandboxInput {
  labels?: Record<string, string>;
  timeoutSeconds?: number;
}

export interface ListSandboxesInput {
  labels?: Record<string, string>;
  states?: SandboxState[];
  limit?: number;
  cursor?: string;
}

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Cursor = opaque base64url of the last item's position; stable under inserts. */
export function encodeCursor(s: Pick<Sandbox, 'createdAt' | 'id'>): string {
  return Buffer.from(`${s.createdAt.toISOString()}|${s.id}`).toString('base64url');
}

function decodeCursor(cursor: string): { createdAt: Date; id: string } {
  const [iso, id] = Buffer.from(cursor, 'base64url').toString('utf8').split('|');
  const createdAt = new Date(iso ?? '');
  if (!id || Number.isNaN(createdAt.getTime())) throw errors.validation('cursor', 'is not a cursor returned by this API');
  return { createdAt, id };
}

/**
 * The sandbox engine. Every lifecycle verb follows the same pattern: compare-and-set the row
 * into the operation's transitional state (so concurrent requests cannot both act), call the
 * host agent outside any transaction, then compare-and-set the outcome. A crash between the
 * two writes leaves a transitional row with an owner, which the reconciler finishes.
 */
export class SandboxService {
  constructor(
    private readonly db: Db,
    private readonly hosts: HostService,
    private readonly limits: SandboxLimits,
    /** Id of this control-plane instance, recorded as the owner of operations it runs. */
    private readonly instanceId: string,
  ) {}

  private repo() {
    return sandboxRepository(this.db);
  }

  async create(principal: Principal, input: CreateSandboxInput): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:create');
    if (principal.sandboxIds !== null) throw errors.forbidden('this API key is limited to given sandboxes and cannot create new ones');
    const spec = this.validateCreate(input);
    const host = await this.hosts.pickHost();
    const operationId = newOperationId();
    const created = await this.repo().insertCreating({
      id: newSandboxId(),
      organizationId: principal.organizationId,
      hostId: host.id,
      ...spec,
      operationId,
      operationOwner: this.instanceId,
    });
    const client = this.hosts.clientForRecord(host);
    try {
      await client.createSandbox(this.hostSpec(created));
    } catch (err) {
      await this.rollBackCreate(created, client, operationId, err);
      throw toNestboxError(err);
    }
    const now = new Date();
    const running = await this.repo().transition(created.id, ['creating'], {
      state: 'running',
      ...this.clearOperation(),
      startedAt: now,
      expiresAt: this.deadline(created.timeoutSeconds, now),
    }, operationId);
    if (!running) {
      // Deleted while it was being created: the delete owns the cleanup; report what happened.
      throw errors.invalidState('sandbox', created.id, (await this.repo().findById(created.id))?.state ?? 'deleted', ['creating'], 'create');
    }
    return running;
  }

  /** A failed create leaves nothing behind: the host removes what it built and the row is closed as deleted. */
  private async rollBackCreate(sandbox: Sandbox, client: HostClient, operationId: string, cause: unknown): Promise<void> {
    const message = `create failed: ${toNestboxError(cause).message}`;
    try {
      await client.destroySandbox(sandbox.id);
      await this.repo().transition(sandbox.id, ['creating'], { state: 'deleted', ...this.clearOperation(), errorMessage: message, deletedAt: new Date() }, operationId);
    } catch {
      // Host unreachable: keep the row visible as error so the reconciler and the user can clean up.
      await this.repo().transition(sandbox.id, ['creating'], { state: 'error', ...this.clearOperation(), errorMessage: message }, operationId);
    }
  }

  private validateCreate(input: CreateSandboxInput) {
    const l = this.limits;
    const cpu = input.cpu ?? l.defaultCpu;
    if (!Number.isInteger(cpu) || cpu < 1 || cpu > l.maxCpu) throw errors.validation('cpu', `must be an integer from 1 to ${l.maxCpu}`);
    const memoryMiB = input.memoryMiB ?? l.defaultMemoryMiB;
    if (!Number.isInteger(memoryMiB) || memoryMiB < l.minMemoryMiB || memoryMiB > l.maxMemoryMiB) {
      throw errors.validation('memoryMiB', `must be an integer from ${l.minMemoryMiB} to ${l.maxMemoryMiB}`);
    }
    const timeoutSeconds = this.validateTimeout(input.timeoutSeconds ?? l.defaultTimeoutSeconds);
    const env = input.env ?? {};
    for (const [name, value] of Object.entries(env)) {
      if (!ENV_NAME.test(name)) throw errors.validation(`env.${name}`, 'is not a valid environment variable name');
      if (value.includes('\0')) throw errors.validation(`env.${name}`, 'must not contain NUL');
    }
    const image = input.image ?? l.defaultImage;
    if (image !== l.defaultImage) throw errors.validation('image', `unknown image "${image}" (available: ${l.defaultImage})`);
    return { image, cpu, memoryMiB, env, labels: input.labels ?? {}, timeoutSeconds };
  }

  private validateTimeout(timeoutSeconds: number): number {
    const max = this.limits.maxTimeoutSeconds;
    if (!Number.isInteger(timeoutSeconds) || timeoutSeconds < 0 || timeoutSeconds > max) {
      throw errors.validation('timeoutSeconds', `must be an integer from 0 (no timeout) to ${max}`);
    }
    return timeoutSeconds;
  }

  private deadline(timeoutSeconds: number, from: Date): Date | null {
    return timeoutSeconds === 0 ? null : new Date(from.getTime() + timeoutSeconds * 1000);
  }

  private clearOperation(): SandboxPatch {
    return { operation: null, operationId: null, operationOwner: null, operationStartedAt: null };
  }

  private hostSpec(s: Sandbox): HostSandboxSpec {
    return { id: s.id, image: s.image, cpu: s.cpu, memoryMiB: s.memoryMiB, env: s.env };
  }

  /** The only way handlers load a sandbox: another organisation's (or a key's unlisted) sandbox is simply not found. */
  async get(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:read');
    return this.load(principal, id);
  }

  private async load(principal: Principal, id: string): Promise<Sandbox> {
    const sandbox = canSeeSandbox(principal, id) ? await this.repo().findVisible(id, principal.organizationId) : undefined;
    if (!sandbox) throw errors.notFound('sandbox', id);
    return sandbox;
  }

  async list(principal: Principal, input: ListSandboxesInput): Promise<{ items: Sandbox[]; nextCursor: string | null }> {
    requireScope(principal, 'sandboxes:read');
    const limit = input.limit ?? 50;
    if (!Number.isInteger(limit) || limit < 1 || limit > this.limits.maxListLimit) {
      throw errors.validation('limit', `must be an integer from 1 to ${this.limits.maxListLimit}`);
    }
    const items = await this.repo().list({
      organizationId: principal.organizationId,
      labels: input.labels,
      states: input.states,
      ids: principal.sandboxIds ? [...principal.sandboxIds] : undefined,
      limit: limit + 1,
      after: input.cursor ? decodeCursor(input.cursor) : undefined,
    });
    const page = items.slice(0, limit);
    return { items: page, nextCursor: items.length > limit ? encodeCursor(page[page.length - 1]) : null };
  }

  async update(principal: Principal, id: string, input: UpdateSandboxInput): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:operate');
    const sandbox = await this.load(principal, id);
    const patch: SandboxPatch = {};
    if (input.labels !== undefined) patch.labels = input.labels;
    if (input.timeoutSeconds !== undefined) {
      patch.timeoutSeconds = this.validateTimeout(input.timeoutSeconds);
      // A new timeout counts from now for a running sandbox: this is the keep-alive call.
      if (sandbox.state === 'running') patch.expiresAt = this.deadline(patch.timeoutSeconds, new Date());
    }
    if (Object.keys(patch).length === 0) return sandbox;
    return (await this.repo().update(id, patch)) ?? sandbox;
  }

  /** Mark the beginning of `op`: compare-and-set into its transitional state, owned by this instance. */
  private async begin(sandbox: Sandbox, op: Operation): Promise<{ sandbox: Sandbox; operationId: string }> {
    assertCanBegin(op, sandbox.id, sandbox.state);
    const operationId = newOperationId();
    const began = await this.repo().transition(sandbox.id, op.from, {
      state: op.via,
      operation: op.name,
      operationId,
      operationOwner: this.instanceId,
      operationStartedAt: new Date(),
    });
    if (!began) {
      const current = (await this.repo().findById(sandbox.id))?.state ?? 'deleted';
      throw errors.invalidState('sandbox', sandbox.id, current, op.from, op.name);
    }
    return { sandbox: began, operationId };
  }

  async stop(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:operate');
    const sandbox = await this.load(principal, id);
    if (sandbox.state === 'stopped') return sandbox; // retry-safe
    const { operationId } = await this.begin(sandbox, OPERATIONS.stop);
    return this.finishStop(sandbox, operationId);
  }

  /** Used by the API, the timeout sweeper and the reconciler alike. */
  async finishStop(sandbox: Sandbox, operationId: string): Promise<Sandbox> {
    try {
      const client = await this.hosts.clientFor(sandbox.hostId!);
      await client.stopSandbox(sandbox.id);
    } catch (err) {
      const e = toNestboxError(err);
      await this.repo().transition(sandbox.id, ['stopping'], { state: 'error', ...this.clearOperation(), errorMessage: `stop failed: ${e.message}` }, operationId);
      throw e;
    }
    const stopped = await this.repo().transition(sandbox.id, ['stopping'], {
      state: 'stopped',
      ...this.clearOperation(),
      expiresAt: null,
      stoppedAt: new Date(),
      errorMessage: null,
    }, operationId);
    return stopped ?? (await this.repo().findById(sandbox.id))!;
  }

  async resume(principal: Principal, id: string): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:operate');
    const sandbox = await this.load(principal, id);
    if (sandbox.state === 'running') return sandbox; // retry-safe
    const { operationId } = await this.begin(sandbox, OPERATIONS.start);
    let result;
    try {
      const client = await this.hosts.clientFor(sandbox.hostId!);
      result = await client.startSandbox(this.hostSpec(sandbox));
    } catch (err) {
      const e = toNestboxError(err);
      await this.repo().transition(sandbox.id, ['starting'], { state: 'stopped', ...this.clearOperation(), errorMessage: `resume failed: ${e.message}` }, operationId);
      throw e;
    }
    const now = new Date();
    const running = await this.repo().transition(sandbox.id, ['starting'], {
      state: 'running',
      ...this.clearOperation(),
      startedAt: now,
      expiresAt: this.deadline(sandbox.timeoutSeconds, now),
      memoryRestored: result.memoryRestored,
      resumeReason: result.memoryRestored ? null : (result.resumeReason ?? 'unknown'),
      errorMessage: null,
    }, operationId);
    return running ?? (await this.repo().findById(sandbox.id))!;
  }

  async delete(principal: Principal, id: string): Promise<void> {
    requireScope(principal, 'sandboxes:delete');
    const sandbox = await this.load(principal, id);
    const { operationId } = await this.begin(sandbox, OPERATIONS.delete);
    await this.finishDelete(sandbox, operationId);
  }

  async finishDelete(sandbox: Sandbox, operationId: string): Promise<void> {
    try {
      if (sandbox.hostId) await (await this.hosts.clientFor(sandbox.hostId)).destroySandbox(sandbox.id);
    } catch (err) {
      const e = toNestboxError(err);
      await this.repo().transition(sandbox.id, ['deleting'], { state: 'error', ...this.clearOperation(), errorMessage: `delete failed: ${e.message}` }, operationId);
      throw e;
    }
    await this.repo().transition(sandbox.id, ['deleting'], { state: 'deleted', ...this.clearOperation(), expiresAt: null, deletedAt: new Date() }, operationId);
  }

  /** Resolve a sandbox that must be running for `operation`, plus its host client. */
  private async runningSandbox(principal: Principal, id: string, operation: string): Promise<{ sandbox: Sandbox; client: HostClient }> {
    const sandbox = await this.load(principal, id);
    assertRunning(sandbox.id, sandbox.state, operation);
    return { sandbox, client: await this.hosts.clientFor(sandbox.hostId!) };
  }

  async exec(principal: Principal, id: string, input: ExecInput, signal?: AbortSignal): Promise<ExecResult> {
    requireScope(principal, 'sandboxes:exec');
    const { client } = await this.runningSandbox(principal, id, 'run a command in');
    return client.exec(id, input, signal);
  }

  async readFile(principal: Principal, id: string, path: string, range?: string): Promise<FileDownload> {
    requireScope(principal, 'files:read');
    const { client } = await this.runningSandbox(principal, id, 'read files of');
    return client.readFile(id, path, range);
  }

  async writeFile(principal: Principal, id: string, path: string, body: Readable, mode?: string): Promise<FileEntry> {
    requireScope(principal, 'files:write');
    const { client } = await this.runningSandbox(principal, id, 'write files of');
    return client.writeFile(id, path, body, mode);
  }


  /**
   * The sandbox's toolbox channel: any guest-agent route (processes, sessions, files, watch),
   * after the same checks as every other call — scope, visibility, running state. Front doors
   * (native handlers, compat translators) build the guest path; core owns who may use it.
   */
  async agentRequest(principal: Principal, id: string, scope: Scope, operation: string, request: AgentRequest): Promise<IncomingMessage> {
    requireScope(principal, scope);
    const { client } = await this.runningSandbox(principal, id, operation);
    return client.agentRequest(id, request);
  }

  async agentWebSocket(principal: Principal, id: string, scope: Scope, operation: string, path: string): Promise<AgentWebSocketTarget> {
    requireScope(principal, scope);
    const { client } = await this.runningSandbox(principal, id, operation);
    return client.agentWebSocket(id, path);
  }
}

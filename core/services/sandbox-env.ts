// Changing a sandbox's default environment at run time (issue 19: Daytona's `updateEnv`, the
// native `PATCH /sandboxes/{id}/env`): what every later exec, process, session and PTY starts
// with. The sandbox row's `env` is the truth: it is changed in one UPDATE (unset, then set, so
// two concurrent changes both land; sandboxRepository.changeEnv) and is what the host agent is given at every start, so the
// change survives a stop/start; a running sandbox's guest agent gets it at once (`PUT /env`).
// Processes already running keep the environment they started with.
import type { Db } from '../store/db.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { errors } from '../errors.js';
import { isTransitional } from '../state-machine.js';
import type { Principal, Sandbox } from '../types.js';
import { requireScope } from './auth.js';
import type { SandboxService } from './sandboxes.js';

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
/** Variables one change may name, and the bytes a sandbox's whole env may hold. */
const MAX_NAMES = 1000;
const MAX_ENV_BYTES = 256 * 1024;

export interface EnvChange {
  set?: unknown;
  unset?: unknown;
}

export class SandboxEnvService {
  constructor(
    private readonly db: Db,
    private readonly sandboxes: Pick<SandboxService, 'get' | 'guestFor'>,
  ) {}

  private validate(input: EnvChange): { set: Record<string, string>; unset: string[] } {
    const set: Record<string, string> = {};
    if (input.set !== undefined && input.set !== null) {
      if (typeof input.set !== 'object' || Array.isArray(input.set)) throw errors.validation('set', 'must be an object of variable names to string values');
      const entries = Object.entries(input.set as Record<string, unknown>);
      if (entries.length > MAX_NAMES) throw errors.validation('set', `must name at most ${MAX_NAMES} variables`);
      for (const [name, value] of entries) {
        if (!ENV_NAME.test(name)) throw errors.validation(`set.${name}`, 'is not a valid environment variable name (letters, digits and "_", not starting with a digit)');
        if (typeof value !== 'string') throw errors.validation(`set.${name}`, 'must be a string');
        if (value.includes('\0')) throw errors.validation(`set.${name}`, 'must not contain NUL');
        set[name] = value;
      }
    }
    let unset: string[] = [];
    if (input.unset !== undefined && input.unset !== null) {
      if (!Array.isArray(input.unset) || input.unset.length > MAX_NAMES) throw errors.validation('unset', `must be an array of at most ${MAX_NAMES} variable names`);
      input.unset.forEach((name, i) => {
        if (typeof name !== 'string' || !ENV_NAME.test(name)) throw errors.validation(`unset[${i}]`, 'is not a valid environment variable name');
      });
      unset = [...new Set(input.unset as string[])];
    }
    return { set, unset };
  }

  /** `unset` is removed before `set` is applied (Daytona's documented order). Answers the sandbox as it now is. */
  async update(principal: Principal, id: string, input: EnvChange): Promise<Sandbox> {
    requireScope(principal, 'sandboxes:exec');
    const change = this.validate(input);
    const sandbox = await this.sandboxes.get(principal, id);
    if (isTransitional(sandbox.state)) throw errors.invalidState('sandbox', sandbox.id, sandbox.state, ['running', 'paused', 'stopped', 'error'], 'change the environment of');
    const projected = { ...sandbox.env };
    for (const name of change.unset) delete projected[name];
    if (Buffer.byteLength(JSON.stringify({ ...projected, ...change.set })) > MAX_ENV_BYTES) throw errors.validation('set', `the sandbox's environment would exceed ${MAX_ENV_BYTES} bytes`);
    const live = sandbox.state === 'running' || sandbox.state === 'paused';
    // Resolved first (a paused sandbox is woken), so a sandbox that cannot take it is refused before the row changes.
    const guest = live ? await this.sandboxes.guestFor(principal, id, 'change the environment of') : undefined;
    const env = await sandboxRepository(this.db).changeEnv(sandbox.id, sandbox.organizationId, change);
    if (!env) throw errors.notFound('sandbox', id);
    if (guest) await guest.setEnv({ env: change.set, unset: change.unset });
    return { ...sandbox, env };
  }
}

// E2B's code contexts (e2b.md (e), e2b-wave2.md §3) over core's (core.codeInterpreter): a context
// is one of core's, shown as `{id, language, cwd}`; the kernels and their bookkeeping are core's.
//
// Upstream's server starts a python and a javascript context when the sandbox boots, so a fresh
// sandbox lists both. Nestbox starts no kernel nobody uses: the list shows those two default
// contexts (`default-python`, `default-javascript`, core's ids for them) as existing from the
// start, and core starts each at its first run (a run by language, or by one of these ids).
import { NestboxError } from '../../../core/errors.js';
import type { CodeContext, CodeLanguage } from '../../../core/code-interpreter/types.js';
import { ROOT_ACCOUNT, sandboxAccounts, type SandboxAccount } from '../../sandbox-accounts.js';
import type { E2bDeps } from '../deps.js';
import { E2B_DEFAULT_USER } from '../routing.js';
import type { SandboxTarget } from '../target.js';

/** E2B's view of a context. */
export interface E2bContext {
  id: string;
  language: string;
  cwd: string;
}

/** The contexts upstream starts at boot, listed before anything else. */
const BOOT_LANGUAGES: CodeLanguage[] = ['python', 'javascript'];
const DEFAULT_ID_PREFIX = 'default-';

/**
 * A language as upstream's server reads it: lower-cased and trimmed, `js`/`ts` spelled out,
 * empty meaning python. `deno` (upstream's kernel name for both, which its tests use as a
 * language) is TypeScript on Deno's kernel here. Anything else is passed on for core to accept
 * or refuse (validation_failed naming `language`).
 */
export function normalizeLanguage(language: string | undefined): string {
  const l = (language ?? '').trim().toLowerCase();
  if (l === '') return 'python';
  if (l === 'js') return 'javascript';
  if (l === 'ts' || l === 'deno') return 'typescript';
  return l;
}

export const defaultContextId = (language: string) => `${DEFAULT_ID_PREFIX}${language}`;

/** The language of a default context id (`default-python` → python), else undefined. */
export function defaultContextLanguage(id: string): string | undefined {
  return id.startsWith(DEFAULT_ID_PREFIX) ? id.slice(DEFAULT_ID_PREFIX.length) : undefined;
}

export const e2bView = (c: CodeContext): E2bContext => ({ id: c.id, language: c.language, cwd: c.cwd });

/**
 * The account E2B's code runs as: root, in the home of E2B's `user` (/root in an image without
 * it). Upstream's template starts its Jupyter server with sudo, so its kernels are root while
 * their cwd is /home/user: code may write anywhere, `!apt-get` works, a context may start in
 * /root. A template's setUser does not change it (upstream neither).
 */
export async function codeAccount(deps: E2bDeps, target: SandboxTarget): Promise<SandboxAccount> {
  const user = await sandboxAccounts(deps.core.toolbox).resolve(target.principal, target.sandboxId, undefined, E2B_DEFAULT_USER);
  return { ...ROOT_ACCOUNT, home: user.home };
}

export function contextNotFound(id: string): NestboxError {
  return new NestboxError('not_found', `Context ${id} not found`);
}

/** A core not_found about a context, said as upstream says it (the SDK shows the text). */
export async function asContextNotFound<T>(id: string, work: Promise<T>): Promise<T> {
  try {
    return await work;
  } catch (err) {
    if (err instanceof NestboxError && err.code === 'not_found' && !/sandbox/i.test(err.message)) throw contextNotFound(id);
    throw err;
  }
}

export async function createContext(deps: E2bDeps, target: SandboxTarget, input: { language?: string; cwd?: string }): Promise<E2bContext> {
  const account = await codeAccount(deps, target);
  const context = await deps.core.codeInterpreter.createContext(target.principal, target.sandboxId, {
    language: normalizeLanguage(input.language),
    cwd: input.cwd || account.home,
    user: account.name,
  });
  return e2bView(context);
}

/**
 * Every context of the sandbox, oldest first (the SDK's users take the last one as the newest):
 * the boot contexts first (started or not, for the languages the image has), then the rest.
 */
export async function listContexts(deps: E2bDeps, target: SandboxTarget): Promise<E2bContext[]> {
  const { principal, sandboxId } = target;
  const [running, languages, account] = await Promise.all([
    deps.core.codeInterpreter.listContexts(principal, sandboxId),
    deps.core.codeInterpreter.languages(principal, sandboxId),
    codeAccount(deps, target),
  ]);
  const sorted = [...running].sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  const boot: E2bContext[] = [];
  for (const language of BOOT_LANGUAGES) {
    if (!languages.includes(language)) continue;
    const id = defaultContextId(language);
    const started = sorted.find((c) => c.id === id);
    boot.push(started ? e2bView(started) : { id, language, cwd: account.home });
  }
  const bootIds = new Set(boot.map((c) => c.id));
  return [...boot, ...sorted.filter((c) => !bootIds.has(c.id)).map(e2bView)];
}

/** Whether `id` is a boot context that core has not started (nothing to stop or restart yet). */
async function isUnstartedBootContext(deps: E2bDeps, target: SandboxTarget, id: string): Promise<boolean> {
  const language = defaultContextLanguage(id);
  if (!language || !(BOOT_LANGUAGES as string[]).includes(language)) return false;
  const running = await deps.core.codeInterpreter.listContexts(target.principal, target.sandboxId);
  if (running.some((c) => c.id === id)) return false;
  return (await deps.core.codeInterpreter.languages(target.principal, target.sandboxId)).includes(language as CodeLanguage);
}

export async function removeContext(deps: E2bDeps, target: SandboxTarget, id: string): Promise<void> {
  if (await isUnstartedBootContext(deps, target, id)) return;
  await asContextNotFound(id, deps.core.codeInterpreter.deleteContext(target.principal, target.sandboxId, id));
}

export async function restartContext(deps: E2bDeps, target: SandboxTarget, id: string): Promise<void> {
  // A default context that never ran is as fresh as a restart would make it.
  if (await isUnstartedBootContext(deps, target, id)) return;
  await asContextNotFound(id, deps.core.codeInterpreter.restartContext(target.principal, target.sandboxId, id));
}

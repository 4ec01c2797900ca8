// Code contexts of E2B's code interpreter (port 49999, e2b.md (e)) onto code kernels: each
// context is one kernel (the guest agent's own, toolbox.startKernel) tagged with the context's
// id, so the sandbox's process table is the only record of which contexts exist. Only the
// mapping of E2B's contexts lives here; the kernel and its program are core's and the guest's.
import { sandboxAccounts } from '../../sandbox-accounts.js';
import { E2B_DEFAULT_USER } from '../routing.js';
import { randomBytes } from 'node:crypto';
import { NestboxError } from '../../../core/errors.js';
import type { ProcessInfo } from '../../../core/guest.js';
import type { E2bDeps } from '../deps.js';
import type { SandboxTarget } from '../target.js';

export const KERNEL_TAG_PREFIX = 'nestbox-e2b-kernel:';
/** The context `/execute` uses when none is named. */
export const DEFAULT_CONTEXT_ID = 'default-python';
export const SUPPORTED_LANGUAGES = ['python'] as const;
type Language = (typeof SUPPORTED_LANGUAGES)[number];

export interface CodeContext {
  id: string;
  language: string;
  cwd: string;
}

export interface Kernel {
  context: CodeContext;
  process: ProcessInfo;
}

function tagOf(id: string, language: string): string {
  return `${KERNEL_TAG_PREFIX}${id}:${language}`;
}

function parseTag(tag: string | null): { id: string; language: string } | undefined {
  if (!tag?.startsWith(KERNEL_TAG_PREFIX)) return undefined;
  const rest = tag.slice(KERNEL_TAG_PREFIX.length);
  const at = rest.lastIndexOf(':');
  return at > 0 ? { id: rest.slice(0, at), language: rest.slice(at + 1) } : undefined;
}

export function validateLanguage(language: string | undefined): Language {
  const lang = (language ?? 'python').toLowerCase();
  if (!(SUPPORTED_LANGUAGES as readonly string[]).includes(lang)) {
    throw new NestboxError('validation_failed', `language: "${language}" is not supported by this Nestbox server (supported: ${SUPPORTED_LANGUAGES.join(', ')})`, { field: 'language' });
  }
  return lang as Language;
}

async function kernelProcesses(deps: E2bDeps, target: SandboxTarget, all: boolean): Promise<Kernel[]> {
  const body = await deps.core.toolbox.listProcesses(target.principal, target.sandboxId, all ? { all } : {});
  const kernels: Kernel[] = [];
  for (const p of body.processes) {
    const parsed = parseTag(p.tag);
    if (parsed) kernels.push({ context: { id: parsed.id, language: parsed.language, cwd: p.cwd }, process: p });
  }
  return kernels;
}

export async function listContexts(deps: E2bDeps, target: SandboxTarget): Promise<CodeContext[]> {
  return (await kernelProcesses(deps, target, false)).filter((k) => k.process.status === 'running').map((k) => k.context);
}

async function startKernel(deps: E2bDeps, target: SandboxTarget, id: string, language: string, cwd?: string): Promise<Kernel> {
  const process = await deps.core.toolbox.startKernel(target.principal, target.sandboxId, {
    language: validateLanguage(language),
    tag: tagOf(id, language),
    ...(cwd ? { cwd } : {}),
    // Code runs as E2B's `user` in /home/user (root in an image without that user).
    user: (await sandboxAccounts(deps.core.toolbox).resolve(target.principal, target.sandboxId, undefined, E2B_DEFAULT_USER)).name,
  });
  return { context: { id, language, cwd: process.cwd }, process };
}

export async function createContext(deps: E2bDeps, target: SandboxTarget, input: { language?: string; cwd?: string }): Promise<CodeContext> {
  const language = validateLanguage(input.language);
  return (await startKernel(deps, target, randomBytes(12).toString('hex'), language, input.cwd)).context;
}

/** Concurrent first calls on one context start one kernel, not several (within this replica). */
const starting = new Map<string, Promise<Kernel>>();

/**
 * The running kernel of a context. The default context starts on first use; a context whose
 * kernel died (os._exit, OOM) is started again, like Jupyter restarts a dead kernel.
 */
export async function kernelFor(deps: E2bDeps, target: SandboxTarget, contextId: string | undefined, language?: string): Promise<Kernel> {
  const id = contextId ?? (language && validateLanguage(language) !== 'python' ? `default-${language}` : DEFAULT_CONTEXT_ID);
  const kernels = (await kernelProcesses(deps, target, true)).filter((k) => k.context.id === id);
  const running = kernels.find((k) => k.process.status === 'running');
  if (running) return running;
  // A kernel that was killed (removeContext, or the OOM killer) ends its context; one that
  // exited on its own (os._exit, a crash) is started again.
  if (contextId !== undefined && (kernels.length === 0 || kernels[0].process.status !== 'exited')) throw new NestboxError('not_found', `Context ${contextId} not found`);
  const key = `${target.sandboxId}/${id}`;
  let pending = starting.get(key);
  if (!pending) {
    const previous = kernels[0];
    pending = startKernel(deps, target, id, previous?.context.language ?? 'python', previous?.context.cwd).finally(() => starting.delete(key));
    starting.set(key, pending);
  }
  return pending;
}

/**
 * Kills a context's running kernels and waits until none is listed as running. A kill is a
 * signal and the kernel is reaped a moment later; E2B answers a delete or restart once the old
 * kernel is gone, so a list (or an /execute) right after it must not find it. Bounded: a slow
 * guest is given a few seconds.
 */
async function stopKernels(deps: E2bDeps, target: SandboxTarget, contextId: string, running: Kernel[]): Promise<void> {
  for (const k of running) await deps.core.toolbox.killProcess(target.principal, target.sandboxId, k.process.processId);
  const killed = new Set(running.map((k) => k.process.processId));
  const deadline = Date.now() + 5_000;
  while (Date.now() < deadline) {
    const left = (await kernelProcesses(deps, target, false)).some((k) => k.context.id === contextId && killed.has(k.process.processId) && k.process.status === 'running');
    if (!left) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

export async function removeContext(deps: E2bDeps, target: SandboxTarget, contextId: string): Promise<void> {
  const running = (await kernelProcesses(deps, target, false)).filter((k) => k.context.id === contextId && k.process.status === 'running');
  if (running.length === 0) throw new NestboxError('not_found', `Context ${contextId} not found`);
  await stopKernels(deps, target, contextId, running);
}

/** A fresh kernel for the context (its state is gone), same id, language and cwd. */
export async function restartContext(deps: E2bDeps, target: SandboxTarget, contextId: string): Promise<CodeContext> {
  const kernels = (await kernelProcesses(deps, target, true)).filter((k) => k.context.id === contextId);
  if (kernels.length === 0) throw new NestboxError('not_found', `Context ${contextId} not found`);
  await stopKernels(deps, target, contextId, kernels.filter((k) => k.process.status === 'running'));
  return (await startKernel(deps, target, contextId, kernels[0].context.language, kernels[0].context.cwd)).context;
}

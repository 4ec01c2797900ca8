// An image's start command and readiness check (E2B's setStartCmd/setReadyCmd, the native
// `start` step): run at the end of a build (the `finalize` step, so a broken start command fails
// the build) and at every create or start of a sandbox of the image, before it is handed over.
import type { GuestClient } from '../guest.js';
import type { ReadyCheck } from '../images/build-spec.js';
import type { ImageConfig } from '../images/types.js';
import type { Logger } from '../logger.js';
import type { Sandbox } from '../types.js';
import { NestboxError, toNestboxError } from '../errors.js';
import type { SandboxStartHook } from './sandboxes.js';

export const START_PROCESS_TAG = 'nestbox-start';
const POLL_MS = 500;
const CHECK_TIMEOUT_MS = 10_000;

export interface StartOptions {
  timeoutMs: number;
  signal?: AbortSignal;
  /** Each line worth telling (build logs). */
  onLine?: (text: string) => void;
}

/** The environment processes of an image start with, as a record (later entries win). */
export function envRecord(config: Pick<ImageConfig, 'env'>): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [k, v] of config.env) env[k] = v;
  return env;
}

/**
 * Starts the image's start command (if any) detached, then waits for its readiness check to
 * pass: `timeout` when it does not within `timeoutMs`, `validation_failed` when the start
 * command exits with a failure first (its last output in the message).
 */
export async function runStartCommand(guest: GuestClient, config: ImageConfig, options: StartOptions): Promise<void> {
  const start = config.start;
  if (!start || (!start.command && !start.ready)) return;
  const identity = { cwd: config.workdir || undefined, user: config.user || undefined, env: envRecord(config) };
  let processId: string | undefined;
  if (start.command) {
    const info = await guest.startProcess({ argv: [...config.shell, start.command], tag: START_PROCESS_TAG, ...identity }, { signal: options.signal });
    processId = info.processId;
    options.onLine?.(`start command running (process ${info.processId}): ${start.command}`);
  }
  const ready = start.ready ?? (start.command ? undefined : undefined);
  const deadline = Date.now() + options.timeoutMs;
  for (let attempt = 0; ; attempt++) {
    if (options.signal?.aborted) throw new NestboxError('timeout', 'cancelled while waiting for the start command to be ready');
    if (processId) {
      const info = await guest.getProcess(processId, { signal: options.signal });
      if (info.status !== 'running' && info.exitCode !== 0) {
        const output = await guest.processOutput(processId, {}, { signal: options.signal }).catch(() => undefined);
        const tail = `${output?.stdout ?? ''}${output?.stderr ?? ''}`.trim().split('\n').slice(-10).join('\n');
        throw new NestboxError('validation_failed', `the start command exited with ${info.exitCode === null ? `signal ${info.signal}` : `code ${info.exitCode}`} before it was ready${tail ? `:\n${tail}` : ''}`, { field: 'start' });
      }
    }
    if (!ready || (await isReady(guest, config, ready, identity, options.signal))) {
      options.onLine?.(ready ? `ready: ${describeReady(ready)} passed` : 'start command started (no readiness check)');
      return;
    }
    if (Date.now() >= deadline) throw new NestboxError('timeout', `the start command was not ready within ${Math.round(options.timeoutMs / 1000)} s (check: ${describeReady(ready)})`, { field: 'start' });
    await sleep(Math.min(POLL_MS * Math.min(attempt + 1, 4), Math.max(0, deadline - Date.now())), options.signal);
  }
}

export function describeReady(ready: ReadyCheck): string {
  switch (ready.kind) {
    case 'command': return `command ${JSON.stringify(ready.command)}`;
    case 'port': return `port ${ready.port} listening`;
    case 'url': return `${ready.url} answering ${ready.status ?? 200}`;
    case 'process': return `a process named ${ready.name}`;
    case 'file': return `file ${ready.path} exists`;
    case 'delay': return `${ready.ms} ms passed`;
  }
}

async function isReady(guest: GuestClient, config: ImageConfig, ready: ReadyCheck, identity: { cwd?: string; user?: string; env: Record<string, string> }, signal?: AbortSignal): Promise<boolean> {
  const shellCheck = async (command: string): Promise<boolean> => {
    const result = await guest.exec({ argv: [...config.shell, command], ...identity, timeoutMs: CHECK_TIMEOUT_MS }, { signal }).catch(() => undefined);
    return result?.exitCode === 0;
  };
  switch (ready.kind) {
    case 'command':
      return shellCheck(ready.command);
    case 'port':
      // Read from /proc, so images without ss, netstat or even a shell can be checked.
      return listeningPorts(guest, signal).then((ports) => ports.has(ready.port));
    case 'url':
      return shellCheck(`curl -s -o /dev/null -w '%{http_code}' ${shellQuote(ready.url)} | grep -q ${ready.status ?? 200} || wget -q -S -O /dev/null ${shellQuote(ready.url)} 2>&1 | grep -q ' ${ready.status ?? 200} '`);
    case 'process':
      return shellCheck(`pgrep -f ${shellQuote(ready.name)} > /dev/null`);
    case 'file':
      return guest.statFile(ready.path, { signal }).then(
        () => true,
        () => false,
      );
    case 'delay':
      await sleep(ready.ms, signal);
      return true;
  }
}

/** Ports in LISTEN state in the sandbox's network namespace (/proc/net/tcp and tcp6, state 0A). */
async function listeningPorts(guest: GuestClient, signal?: AbortSignal): Promise<Set<number>> {
  const ports = new Set<number>();
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    const text = await guest
      .readFile(file, {}, { signal })
      .then(async (stream) => {
        const chunks: Buffer[] = [];
        for await (const chunk of stream.body) chunks.push(chunk as Buffer);
        return Buffer.concat(chunks).toString('utf8');
      })
      .catch(() => '');
    for (const line of text.split('\n').slice(1)) {
      const fields = line.trim().split(/\s+/);
      if (fields[3] === '0A') ports.add(parseInt(fields[1]?.split(':')[1] ?? '', 16));
    }
  }
  return ports;
}

export function shellQuote(value: string): string {
  return `'${value.replace(/'/g, `'\\''`)}'`;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}

/** The hook SandboxService runs after a sandbox of an image is created or started. */
export function imageStartHook(images: { ofSandbox(s: Pick<Sandbox, 'imageId' | 'organizationId'>): Promise<{ config: ImageConfig } | undefined> }, logger: Logger, readyTimeoutMs: number): SandboxStartHook {
  return async (sandbox, guest, phase) => {
    const image = await images.ofSandbox(sandbox);
    if (!image?.config.start) return;
    try {
      await runStartCommand(guest, image.config, { timeoutMs: readyTimeoutMs });
    } catch (err) {
      const e = toNestboxError(err);
      logger.warn({ sandboxId: sandbox.id, operation: phase, err: e.message }, "the image's start command did not get ready");
      throw e;
    }
  };
}

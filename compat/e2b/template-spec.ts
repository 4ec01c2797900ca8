// E2B's TemplateBuildStartV2 body (e2b-wave2.md §1.3, step 4 of a template build) → core's
// BuildSpec. Each E2B step becomes one BuildStep whose `at.line` is the step's position as the SDK
// counts its stack frames (step i is frame i + 1, frame 0 is the `from*` call): a failing step is
// then reported back as `reason.step = String(line)` and the SDK points at the user's builder call.
// Steps Nestbox adds itself (E2B's defaults: user `user`, workdir /home/user) carry line 0, which
// is reported as `base`; the start command's readiness check is `finalize`.
//
// E2B's values are literal strings, not Dockerfile text: they become engine words through
// `jsonWord` (quotes and backslashes mean themselves, `$VAR` still expands, as upstream evaluates
// ENV values in a shell). RUN commands go to the shell as written.
import { errors, NestboxError } from '../../core/errors.js';
import type { BuildSpec, BuildStep, SourcePosition } from '../../core/images/build-spec.js';
import { jsonWord } from '../../core/images/expand.js';
import type { HostRegistryCredentials } from '../../core/host-client.js';
import { notSupported } from './errors.js';

/** E2B's base image (`fromBaseImage()`, and the SDK's default): Nestbox's built-in image has its `user` account. */
export const E2B_BASE_IMAGE = 'e2bdev/base';
/** Template names that mean one of Nestbox's built-in images (as for sandbox create). */
export const DEFAULT_TEMPLATES = new Set(['base', 'code-interpreter-v1', 'code-interpreter', 'default']);
/**
 * E2B's code-interpreter templates (`code-interpreter-v1` is the code-interpreter SDK's default):
 * the built-in `code-interpreter` image (Jupyter kernels for python, javascript/typescript, bash
 * and r, and the data stack), as upstream's template is its base image plus those.
 */
export const CODE_INTERPRETER_TEMPLATES = new Set(['code-interpreter-v1', 'code-interpreter']);
export const CODE_INTERPRETER_IMAGE = 'code-interpreter';
/** E2B's default user and workdir of a template (e2b-wave2.md §1.3 fromDockerfile, §1.8). */
export const E2B_USER = 'user';
export const E2B_WORKDIR = '/home/user';
/**
 * The PATH of E2B's base image (Debian's, and what Nestbox's driver gives a sandbox): the built-in
 * image's config carries no environment, so without it `setEnvs({PATH: '$PATH:/x'})` would
 * expand `$PATH` to nothing and leave the build without `ls` (ENV expands the image's variables).
 */
const E2B_BASE_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** Upstream's ready check when a start command names none (§1.8). */
const DEFAULT_READY_MS = 20_000;
/** Object key (per organisation) of a COPY step's uploaded tar, by its files hash. */
export const filesObjectKey = (hash: string) => `e2b/files/${hash}.tar`;
export const FILES_HASH = /^[0-9a-f]{64}$/;

const MAX_STEPS = 1000;
const MAX_STRING = 64 * 1024;
const ENV_NAME = /^[^=\0\s]+$/;
const OCTAL_MODE = /^[0-7]{3,4}$/;

/** What the base of a template resolved to (the caller looks templates up: they are images). */
export type TemplateBase =
  | { kind: 'builtin' }
  /** An image of the organisation, `name:tag`; `user` is its configured user (for COPY's default owner). */
  | { kind: 'image'; reference: string; user: string }
  /** An OCI reference, pulled by the host. */
  | { kind: 'oci'; reference: string };

export interface TemplateBuildRequest {
  spec: BuildSpec;
  noCache: boolean;
  credentials?: HostRegistryCredentials;
}

function field(value: unknown, name: string): string {
  if (typeof value !== 'string') throw errors.validation(name, 'must be a string');
  if (value.length > MAX_STRING) throw errors.validation(name, `must be at most ${MAX_STRING} characters`);
  if (value.includes('\0')) throw errors.validation(name, 'must not contain NUL');
  return value;
}

function optionalString(body: Record<string, unknown>, name: string): string | undefined {
  const value = body[name];
  if (value === undefined || value === null || value === '') return undefined;
  return field(value, name);
}

/** The base of a start-build body: exactly one of `fromImage` / `fromTemplate`. */
export function baseOf(body: Record<string, unknown>): { fromImage?: string; fromTemplate?: string } {
  const fromImage = optionalString(body, 'fromImage');
  const fromTemplate = optionalString(body, 'fromTemplate');
  if (fromImage !== undefined && fromTemplate !== undefined) throw errors.validation('fromTemplate', 'give either fromImage or fromTemplate, not both');
  if (fromImage === undefined && fromTemplate === undefined) return { fromImage: E2B_BASE_IMAGE };
  return { fromImage, fromTemplate };
}

function credentialsOf(body: Record<string, unknown>): HostRegistryCredentials | undefined {
  const registry = body.fromImageRegistry;
  if (registry === undefined || registry === null) return undefined;
  if (typeof registry !== 'object' || Array.isArray(registry)) throw errors.validation('fromImageRegistry', 'must be an object');
  const r = registry as Record<string, unknown>;
  if (r.type === 'aws') throw notSupported('fromAWSRegistry (ECR credentials: use fromImage with a username and password, e.g. AWS and an ECR login token)');
  if (r.type === 'gcp') throw notSupported('fromGCPRegistry (service-account credentials: use fromImage with _json_key and the key as the password)');
  if (r.type !== 'registry') throw errors.validation('fromImageRegistry.type', 'must be "registry", "aws" or "gcp"');
  const username = field(r.username, 'fromImageRegistry.username');
  const password = field(r.password, 'fromImageRegistry.password');
  if (!username || !password) throw errors.validation('fromImageRegistry', 'needs a username and a password');
  return { username, password };
}

function argsOf(step: Record<string, unknown>, where: string): string[] {
  const args = step.args ?? [];
  if (!Array.isArray(args)) throw errors.validation(`${where}.args`, 'must be a list of strings');
  return args.map((a, i) => field(a, `${where}.args[${i}]`));
}

/**
 * Translates a start-build body onto a BuildSpec. `base` is what the body's base resolved to;
 * the caller resolves `fromTemplate` names (templates are images) before calling.
 */
export function templateBuildRequest(body: Record<string, unknown>, base: TemplateBase): TemplateBuildRequest {
  const rawSteps = body.steps ?? [];
  if (!Array.isArray(rawSteps)) throw errors.validation('steps', 'must be a list of steps');
  if (rawSteps.length > MAX_STEPS) throw errors.validation('steps', `at most ${MAX_STEPS} steps`);
  if (body.force !== undefined && typeof body.force !== 'boolean') throw errors.validation('force', 'must be true or false');
  const credentials = credentialsOf(body);
  if (credentials && base.kind !== 'oci') throw errors.validation('fromImageRegistry', 'registry credentials go with fromImage (an image pulled from a registry)');

  const steps: BuildStep[] = [];
  const added = (text: string): SourcePosition => ({ line: 0, text });
  // E2B runs a template's steps as `user` in /home/user unless they say otherwise. The built-in
  // image has that account; an image from a registry gets it first (as upstream provisions its
  // bases); a template built on another template keeps that template's user and workdir.
  let user = base.kind === 'image' ? base.user : E2B_USER;
  if (base.kind === 'oci') {
    steps.push({
      at: added(`RUN (Nestbox: create the ${E2B_USER} account E2B templates run as)`),
      kind: 'run',
      user: 'root',
      // useradd (Debian, Fedora…), adduser (Alpine), else the account files themselves (busybox).
      command: {
        shell: [
          `if ! id -u ${E2B_USER} >/dev/null 2>&1; then`,
          `if command -v useradd >/dev/null 2>&1; then useradd -m -s /bin/bash ${E2B_USER};`,
          `elif command -v adduser >/dev/null 2>&1; then adduser -D ${E2B_USER};`,
          `else echo '${E2B_USER}:x:1000:1000::${E2B_WORKDIR}:/bin/sh' >> /etc/passwd && echo '${E2B_USER}:x:1000:' >> /etc/group; fi;`,
          `fi; mkdir -p ${E2B_WORKDIR} && chown ${E2B_USER}:${E2B_USER} ${E2B_WORKDIR}`,
        ].join(' '),
      },
    });
  }
  if (base.kind === 'builtin') steps.push({ at: added(`ENV PATH=${E2B_BASE_PATH}`), kind: 'env', vars: [['PATH', E2B_BASE_PATH]] });
  if (base.kind !== 'image') {
    steps.push({ at: added(`USER ${E2B_USER}`), kind: 'user', user: E2B_USER });
    steps.push({ at: added(`WORKDIR ${E2B_WORKDIR}`), kind: 'workdir', path: E2B_WORKDIR });
  }

  rawSteps.forEach((raw, index) => {
    const where = `steps[${index}]`;
    if (!raw || typeof raw !== 'object' || Array.isArray(raw)) throw errors.validation(where, 'must be an object');
    const step = raw as Record<string, unknown>;
    const type = typeof step.type === 'string' ? step.type.toUpperCase() : undefined;
    const args = argsOf(step, where);
    if (step.force !== undefined && typeof step.force !== 'boolean') throw errors.validation(`${where}.force`, 'must be true or false');
    const at: SourcePosition = { line: index + 1, text: `${type ?? '?'} ${args.join(' ')}`.slice(0, 1000) };
    // A forced step skips the cache, and so does every step after it (the engine's rule too).
    const common = { at, ...(step.force === true ? { noCache: true } : {}) };
    const need = (n: number, what: string) => {
      if (args.length < n || args.slice(0, n).some((a) => a === '')) throw errors.validation(`${where}.args`, `${type} needs ${what}`);
    };
    switch (type) {
      case 'RUN': {
        need(1, 'a command');
        const runAs = args[1] || undefined;
        steps.push({ ...common, kind: 'run', command: { shell: args[0] }, ...(runAs ? { user: jsonWord(runAs) } : {}) });
        return;
      }
      case 'COPY':
      case 'ADD': {
        need(2, 'a source and a destination');
        const hash = step.filesHash;
        if (typeof hash !== 'string' || !FILES_HASH.test(hash)) throw errors.validation(`${where}.filesHash`, 'must be the 64 hex digits of the files hash the upload link was asked for');
        const owner = args[2] || user;
        const mode = args[3] || undefined;
        if (mode !== undefined && !OCTAL_MODE.test(mode)) throw errors.validation(`${where}.args[3]`, 'must be an octal mode such as 0755');
        steps.push({
          ...common,
          kind: 'copy',
          // The tar's entries are relative to the context root, as `src` is (§1.5).
          sources: [jsonWord(args[0])],
          dest: jsonWord(args[1]),
          contexts: [filesObjectKey(hash)],
          ...(owner && owner !== 'root' ? { chown: jsonWord(owner) } : {}),
          ...(mode ? { chmod: mode } : {}),
        });
        return;
      }
      case 'ENV':
      case 'ARG': {
        if (args.length === 0 || args.length % 2 !== 0) throw errors.validation(`${where}.args`, `${type} takes name and value pairs`);
        const vars: [string, string][] = [];
        for (let i = 0; i < args.length; i += 2) {
          if (!ENV_NAME.test(args[i])) throw errors.validation(`${where}.args[${i}]`, 'must be an environment variable name without =, spaces or NUL');
          vars.push([args[i], jsonWord(args[i + 1])]);
        }
        steps.push({ ...common, kind: 'env', vars });
        return;
      }
      case 'WORKDIR':
        need(1, 'a path');
        steps.push({ ...common, kind: 'workdir', path: jsonWord(args[0]) });
        return;
      case 'USER':
        need(1, 'a user');
        if (args[1] === 'true') throw notSupported('USER with sudoers (its second argument "true")');
        user = args[0];
        steps.push({ ...common, kind: 'user', user: jsonWord(args[0]) });
        return;
      default:
        throw errors.validation(`${where}.type`, `must be RUN, COPY, ENV, WORKDIR or USER (got ${JSON.stringify(step.type ?? null).slice(0, 100)})`);
    }
  });

  const startCmd = optionalString(body, 'startCmd');
  const readyCmd = optionalString(body, 'readyCmd');
  if (startCmd !== undefined || readyCmd !== undefined) {
    steps.push({
      at: { line: rawSteps.length + 1, text: `START ${startCmd ?? ''}${readyCmd ? ` (ready: ${readyCmd})` : ''}`.slice(0, 1000) },
      kind: 'start',
      ...(startCmd !== undefined ? { command: startCmd } : {}),
      ready: readyCmd !== undefined ? { kind: 'command', command: readyCmd } : { kind: 'delay', ms: DEFAULT_READY_MS },
    });
  }

  const reference = base.kind === 'builtin' ? 'default' : base.reference;
  return {
    spec: { stages: [{ index: 0, from: { reference }, at: { line: 0, text: `FROM ${reference}` }, steps }], contexts: [], args: {}, ignore: [] },
    noCache: body.force === true,
    ...(credentials ? { credentials } : {}),
  };
}

/**
 * The E2B `reason.step` of a failed build: `base` (resolving the base, or a step Nestbox added),
 * `finalize` (the start command's readiness check), else the SDK's frame index as a decimal.
 */
export function e2bStepOf(spec: BuildSpec, step: number | 'finalize' | undefined): string | undefined {
  if (step === 'finalize') return 'finalize';
  if (step === undefined) return undefined;
  if (step === 0) return 'base';
  const all = spec.stages.flatMap((s) => s.steps);
  const found = all[step - 1];
  if (!found) return undefined;
  if (found.kind === 'start') return 'finalize';
  return found.at.line === 0 ? 'base' : String(found.at.line);
}

export function isNestboxError(err: unknown, code: string): err is NestboxError {
  return err instanceof NestboxError && err.code === code;
}

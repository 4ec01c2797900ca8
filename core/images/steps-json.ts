// The native API's JSON build spec → BuildSpec: the same instructions as a Dockerfile, as a list
// of one-key objects, plus `start` (a start command with a readiness check), which a Dockerfile
// cannot say. One zod schema (exported for openapi/native.yaml's shape); every error names the
// field path (`steps[3].copy.dest`) and the 1-based step.
//
// Values are words with Dockerfile meaning for `$VAR` (`"PATH": "/opt/bin:$PATH"` expands in the
// engine, `\$` is a literal `$`) but otherwise literal: quotes and backslashes mean themselves
// (`jsonWord`). RUN/CMD/ENTRYPOINT strings go to the shell as written.
import { z } from 'zod';
import { BuildSpecError, type BuildSpec, type BuildStage, type BuildStep, type CommandForm, type ReadyCheck } from './build-spec.js';
import { isRemoteSource } from './dockerfile.js';
import { jsonWord, parseWord, WordSyntaxError } from './expand.js';

export const STEPS_MAX = 1000;
export const STAGES_MAX = 50;
export const STRING_MAX = 64 * 1024;
const LIST_MAX = 1000;

const str = z.string().max(STRING_MAX);
const nonEmpty = str.min(1);
const name = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'a name of letters, digits and _, not starting with a digit');
const envName = z
  .string()
  .min(1)
  .max(1024)
  .regex(/^[^=\0\s]+$/, 'an environment variable name without =, spaces or NUL');
const stageName = z.string().regex(/^[a-z][a-z0-9._-]*$/, 'a lower-case stage name (letters, digits, . _ -)');
const command = z.union([nonEmpty, z.array(str).min(1).max(LIST_MAX)]);
const paths = z.union([nonEmpty, z.array(nonEmpty).min(1).max(LIST_MAX)]);
const octal = z.string().regex(/^[0-7]{3,4}$/, 'an octal mode such as 0755');

const copySchema = z.strictObject({
  src: paths,
  dest: nonEmpty,
  chown: nonEmpty.optional(),
  chmod: octal.optional(),
  /** An earlier stage's name (COPY --from). */
  from: stageName.optional(),
});

const readySchema = z.union([
  z.strictObject({ command: nonEmpty }),
  z.strictObject({ port: z.number().int().min(1).max(65535) }),
  z.strictObject({ url: z.url().max(8192), status: z.number().int().min(100).max(599).optional() }),
  z.strictObject({ process: nonEmpty }),
  z.strictObject({ file: nonEmpty }),
  z.strictObject({ delayMs: z.number().int().min(0).max(3_600_000) }),
]);

const STEP_KINDS = ['run', 'copy', 'add', 'env', 'arg', 'workdir', 'user', 'shell', 'label', 'expose', 'cmd', 'entrypoint', 'start'] as const;

/** One step: exactly one of the instruction keys, plus `noCache` (and `user` beside `run`). */
export const buildStepSchema = z
  .strictObject({
    run: command.optional(),
    copy: copySchema.optional(),
    add: copySchema.optional(),
    env: z.record(envName, str).optional(),
    arg: z.strictObject({ name, default: str.optional() }).optional(),
    workdir: nonEmpty.optional(),
    /** USER on its own; beside `run`, the user that one command runs as. */
    user: nonEmpty.optional(),
    shell: z.array(nonEmpty).min(1).max(LIST_MAX).optional(),
    label: z.record(z.string().min(1).max(1024), str).optional(),
    expose: z
      .array(z.union([z.number().int().min(1).max(65535), z.string().regex(/^\d{1,5}(-\d{1,5})?(\/(tcp|udp|sctp))?$/i, 'a port such as 8080 or 53/udp')]))
      .min(1)
      .max(LIST_MAX)
      .optional(),
    cmd: command.optional(),
    entrypoint: command.optional(),
    start: z
      .strictObject({ command: nonEmpty.optional(), ready: readySchema.optional() })
      .refine((s) => s.command !== undefined || s.ready !== undefined, 'start needs a command, a ready check, or both')
      .optional(),
    noCache: z.boolean().optional(),
  })
  .superRefine((step, ctx) => {
    const present = STEP_KINDS.filter((k) => step[k] !== undefined && !(k === 'user' && step.run !== undefined));
    if (present.length !== 1) {
      ctx.addIssue({
        code: 'custom',
        message:
          present.length === 0
            ? `a step needs exactly one of ${STEP_KINDS.join(', ')}`
            : `a step has exactly one instruction; found ${present.join(' and ')}`,
      });
    }
  });

const stepsSchema = z.array(buildStepSchema).max(STEPS_MAX);

/** The native JSON build spec. The last (unnamed) stage is `from` + `steps`; `stages` come before it. */
export const buildStepsSchema = z.strictObject({
  from: nonEmpty.default('default'),
  steps: stepsSchema,
  stages: z
    .array(z.strictObject({ name: stageName.optional(), from: nonEmpty, steps: stepsSchema }))
    .max(STAGES_MAX)
    .optional(),
  args: z.record(name, str).optional(),
  ignore: z.array(str).max(10_000).optional(),
  contexts: z.array(nonEmpty).max(100).optional(),
});

export type BuildStepsInput = z.input<typeof buildStepsSchema>;
type StepInput = z.output<typeof buildStepSchema>;

type Path = (string | number)[];

function fieldOf(path: readonly PropertyKey[]): string {
  let out = '';
  for (const seg of path) {
    if (typeof seg === 'number') out += `[${seg}]`;
    else if (typeof seg === 'string' && /^[A-Za-z_][A-Za-z0-9_]*$/.test(seg)) out += out === '' ? seg : `.${seg}`;
    else out += `[${JSON.stringify(String(seg))}]`;
  }
  return out === '' ? 'body' : out;
}

/** The 1-based index of the step a path is inside (its innermost `steps[n]`). */
function stepLine(path: readonly PropertyKey[]): number | undefined {
  for (let i = path.length - 2; i >= 0; i--) {
    if (path[i] === 'steps' && typeof path[i + 1] === 'number') return (path[i + 1] as number) + 1;
  }
  return undefined;
}

function fail(path: Path, message: string): never {
  throw new BuildSpecError(fieldOf(path), stepLine(path), message);
}

/** A JSON value as an engine word (see the top of the file); a malformed `${` is refused here. */
function wordAt(path: Path, value: string): string {
  const w = jsonWord(value);
  try {
    parseWord(w);
  } catch (err) {
    if (err instanceof WordSyntaxError) fail(path, err.message);
    throw err;
  }
  return w;
}

function commandOf(value: string | string[]): CommandForm {
  return typeof value === 'string' ? { shell: value } : { argv: value };
}

function readyOf(ready: z.output<typeof readySchema>): ReadyCheck {
  if ('command' in ready) return { kind: 'command', command: ready.command };
  if ('port' in ready) return { kind: 'port', port: ready.port };
  if ('url' in ready) return { kind: 'url', url: ready.url, ...(ready.status !== undefined ? { status: ready.status } : {}) };
  if ('process' in ready) return { kind: 'process', name: ready.process };
  if ('file' in ready) return { kind: 'file', path: ready.file };
  return { kind: 'delay', ms: ready.delayMs };
}

function stepOf(step: StepInput, path: Path, stageIndex: number, stageNames: (string | undefined)[]): BuildStep {
  const at = { line: (path[path.length - 1] as number) + 1, text: JSON.stringify(step).slice(0, 1000) };
  const base = { at, ...(step.noCache ? { noCache: true } : {}) };
  if (step.run !== undefined) return { ...base, kind: 'run', command: commandOf(step.run), ...(step.user !== undefined ? { user: step.user } : {}) };
  const copy = step.copy ?? step.add;
  if (copy) {
    const key = step.copy ? 'copy' : 'add';
    const sources = typeof copy.src === 'string' ? [copy.src] : copy.src;
    if (key === 'add') {
      sources.forEach((s, i) => {
        if (isRemoteSource(s)) fail([...path, key, 'src', ...(typeof copy.src === 'string' ? [] : [i])], `${s}: builds do not download through add; use a run step with curl (or git clone) instead`);
      });
    }
    const out: Extract<BuildStep, { kind: 'copy' }> = {
      ...base,
      kind: 'copy',
      sources: sources.map((s, i) => wordAt([...path, key, 'src', ...(typeof copy.src === 'string' ? [] : [i])], s)),
      dest: wordAt([...path, key, 'dest'], copy.dest),
    };
    if (sources.length > 1 && !copy.dest.endsWith('/')) fail([...path, key, 'dest'], 'several sources need a destination ending with /');
    if (copy.from !== undefined) {
      const i = stageNames.indexOf(copy.from);
      if (i < 0 || i >= stageIndex) fail([...path, key, 'from'], `no stage named ${JSON.stringify(copy.from)} before this one`);
      out.fromStage = i;
    }
    if (copy.chown !== undefined) out.chown = wordAt([...path, key, 'chown'], copy.chown);
    if (copy.chmod !== undefined) out.chmod = copy.chmod;
    if (key === 'add') out.extractArchives = true;
    return out;
  }
  if (step.env) return { ...base, kind: 'env', vars: Object.entries(step.env).map(([k, v]) => [k, wordAt([...path, 'env', k], v)]) };
  if (step.arg) {
    const def = step.arg.default;
    return { ...base, kind: 'arg', name: step.arg.name, ...(def !== undefined ? { default: wordAt([...path, 'arg', 'default'], def) } : {}) };
  }
  if (step.workdir !== undefined) return { ...base, kind: 'workdir', path: wordAt([...path, 'workdir'], step.workdir) };
  if (step.user !== undefined) return { ...base, kind: 'user', user: wordAt([...path, 'user'], step.user) };
  if (step.shell) return { ...base, kind: 'shell', argv: step.shell };
  if (step.label) return { ...base, kind: 'label', labels: Object.entries(step.label).map(([k, v]) => [k, wordAt([...path, 'label', k], v)]) };
  if (step.expose) return { ...base, kind: 'expose', ports: step.expose.map(String) };
  if (step.cmd !== undefined) return { ...base, kind: 'cmd', command: commandOf(step.cmd) };
  if (step.entrypoint !== undefined) return { ...base, kind: 'entrypoint', command: commandOf(step.entrypoint) };
  const start = step.start!;
  return { ...base, kind: 'start', ...(start.command !== undefined ? { command: start.command } : {}), ...(start.ready ? { ready: readyOf(start.ready) } : {}) };
}

/**
 * Parses the native JSON build spec (`buildStepsSchema`) into a BuildSpec, or throws a
 * BuildSpecError whose field is the path of the first problem and whose line is the 1-based
 * step (within its list).
 */
export function parseBuildSteps(input: unknown): BuildSpec {
  const parsed = buildStepsSchema.safeParse(input);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    fail(issue.path as Path, issue.message);
  }
  const spec = parsed.data;
  const earlier = spec.stages ?? [];
  const stageNames = [...earlier.map((s) => s.name), undefined];
  const lists: { from: string; name?: string; steps: StepInput[]; path: Path }[] = [
    ...earlier.map((s, i) => ({ from: s.from, name: s.name, steps: s.steps, path: ['stages', i] as Path })),
    { from: spec.from, steps: spec.steps, path: [] },
  ];
  const total = lists.reduce((n, l) => n + l.steps.length, 0);
  if (total > STEPS_MAX) fail(['steps'], `more than ${STEPS_MAX} steps in all stages`);

  const stages: BuildStage[] = lists.map((list, index) => {
    const dup = list.name !== undefined && stageNames.indexOf(list.name) !== index;
    if (dup) fail([...list.path, 'name'], `duplicate stage name ${JSON.stringify(list.name)}`);
    const fromPath: Path = list.path.length ? [...list.path, 'from'] : ['from'];
    const target = stageNames.indexOf(list.from.toLowerCase());
    const from: BuildStage['from'] = { reference: list.from };
    if (target >= 0) {
      if (target >= index) fail(fromPath, `stage ${JSON.stringify(list.from)} is not defined before this one`);
      from.stage = target;
    }
    const steps = list.steps.map((step, i) => stepOf(step, [...list.path, 'steps', i], index, stageNames));
    return {
      index,
      ...(list.name !== undefined ? { name: list.name } : {}),
      from,
      at: { line: 1, text: `FROM ${list.from}${list.name ? ` AS ${list.name}` : ''}` },
      steps,
    };
  });
  return { stages, contexts: spec.contexts ?? [], args: spec.args ?? {}, ignore: spec.ignore ?? [] };
}

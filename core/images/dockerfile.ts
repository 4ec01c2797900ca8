// Dockerfile → BuildSpec. dockerfile-ast does the parsing (directives, comments, continuation
// lines, the escape directive, flags, ENV/ARG/LABEL name=value pairs); this module maps every
// instruction onto a BuildStep, and refuses, naming the line, everything Nestbox cannot honour
// (ONBUILD, RUN --mount/--network/--security, heredocs, ADD from a URL or git, …): a build that
// silently skipped an instruction would produce a different image than the user asked for.
//
// Words stay as written (quotes, escapes, `$VAR`) in backslash-escape syntax: the engine expands
// them with `expandWords` once it knows the stage's environment. Only FROM lines (and `--from`)
// are expanded here, with the global ARGs, because stage references are resolved here.
import { DockerfileParser, type Flag, type Instruction, type Property } from 'dockerfile-ast';
import {
  BuildSpecError,
  type BuildSpec,
  type BuildStage,
  type BuildStep,
  type CommandForm,
  type SourcePosition,
} from './build-spec.js';
import { canonicalWord, expandWords, parseWord, quoteWord, WordSyntaxError } from './expand.js';

export { expandWords, quoteWord, canonicalWord, wordVariables } from './expand.js';

export const DOCKERFILE_MAX_BYTES = 1024 * 1024;
export const DOCKERFILE_MAX_INSTRUCTIONS = 1000;

/**
 * The platform ARGs BuildKit defines in the global scope. Nestbox builds for linux/amd64 only,
 * so they have one value; a stage sees them after `ARG TARGETARCH`, as in Docker.
 */
export const PLATFORM_ARGS: Readonly<Record<string, string>> = {
  TARGETPLATFORM: 'linux/amd64',
  TARGETOS: 'linux',
  TARGETARCH: 'amd64',
  TARGETVARIANT: '',
  BUILDPLATFORM: 'linux/amd64',
  BUILDOS: 'linux',
  BUILDARCH: 'amd64',
  BUILDVARIANT: '',
};

export interface DockerfileOptions {
  /** Object keys of the context tars (BuildSpec.contexts). */
  contexts?: string[];
  /** `--build-arg` values. */
  args?: Record<string, string>;
  /** .dockerignore patterns (see `parseDockerignore` in copy-archive.ts). */
  ignore?: string[];
}

const FIELD = 'dockerfile';
const ARG_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
// Docker's rule for `AS <name>`, after lower-casing.
const STAGE_NAME = /^[a-z][a-z0-9._-]*$/;
const OCTAL_MODE = /^[0-7]{3,4}$/;
const PORT = /^\d{1,5}(-\d{1,5})?(\/(tcp|udp|sctp))?$/i;
// A URL (any scheme) or an scp-like git address: ADD would fetch it.
const REMOTE_SOURCE = /^([a-z][a-z0-9+.-]*:\/\/|git@)/i;

function fail(line: number | undefined, message: string): never {
  throw new BuildSpecError(FIELD, line, message);
}

/**
 * True for an ADD source Docker would download (a URL or a git address). The parser refuses
 * them; the engine should check again after expansion (`ADD $URL /x`).
 */
export function isRemoteSource(source: string): boolean {
  return REMOTE_SOURCE.test(source);
}

interface Ctx {
  escape: string;
  line: number;
}

/** Checks a word parses (so a bad quote is a 400 at parse time) and renders it canonical. */
function word(ctx: Ctx, raw: string): string {
  try {
    return ctx.escape === '\\' ? (parseWord(raw), raw) : canonicalWord(raw, ctx.escape);
  } catch (err) {
    if (err instanceof WordSyntaxError) fail(ctx.line, err.message);
    throw err;
  }
}

function expandHere(ctx: Ctx, raw: string, vars: Record<string, string>): string {
  return expandWords(raw, vars, { escape: ctx.escape, field: FIELD, line: ctx.line });
}

function flagsOf(instr: Instruction): Flag[] {
  const withFlags = instr as Instruction & { getFlags?: () => Flag[] };
  return typeof withFlags.getFlags === 'function' ? withFlags.getFlags() : [];
}

function content(instr: Instruction): string {
  return instr.getArgumentsContent() ?? '';
}

function positionOf(instr: Instruction): SourcePosition {
  const flags = flagsOf(instr).map((f) => f.toString());
  const text = [instr.getKeyword(), ...flags, content(instr)]
    .filter((s) => s !== '')
    .join(' ')
    .replace(/\r?\n/g, ' ');
  return { line: instr.getRange().start.line + 1, text };
}

/** Whitespace-separated words, as Docker splits the non-JSON form (no quote handling). */
function splitWords(text: string): string[] {
  return text.split(/[ \t\v\f\r\n]+/).filter((w) => w !== '');
}

/** A JSON array of strings, or undefined when the text is not one (Docker then uses the shell form). */
function jsonArray(text: string): string[] | undefined {
  const t = text.trim();
  if (!t.startsWith('[')) return undefined;
  try {
    const v: unknown = JSON.parse(t);
    if (Array.isArray(v) && v.every((x) => typeof x === 'string')) return v as string[];
  } catch {
    // not JSON: shell form
  }
  return undefined;
}

function commandForm(ctx: Ctx, instr: Instruction, keyword: string): CommandForm {
  const text = content(instr);
  const argv = jsonArray(text);
  if (argv) return { argv };
  if (text.trim() === '') fail(ctx.line, `${keyword} needs a command`);
  return { shell: text.trim() };
}

/** Source words of COPY/ADD/VOLUME: the JSON form, or whitespace-separated words. */
function pathWords(ctx: Ctx, instr: Instruction): string[] {
  const text = content(instr);
  const json = jsonArray(text);
  // JSON-form values are words too: BuildKit expands `COPY ["$SRC", "/x"]` like the plain form.
  return (json ?? splitWords(text)).map((w) => word(ctx, w));
}

function flagValue(ctx: Ctx, flag: Flag): string {
  const v = flag.getValue();
  if (v === null || v === '') fail(ctx.line, `flag --${flag.getName()} needs a value (--${flag.getName()}=…)`);
  return v;
}

function checkFlags(ctx: Ctx, keyword: string, flags: Flag[], allowed: readonly string[], refused: Record<string, string> = {}): Map<string, Flag> {
  const seen = new Map<string, Flag>();
  for (const flag of flags) {
    const name = flag.getName();
    if (refused[name]) fail(ctx.line, `${keyword} --${name}: ${refused[name]}`);
    if (!allowed.includes(name)) fail(ctx.line, `unknown flag for ${keyword}: --${name}`);
    if (seen.has(name)) fail(ctx.line, `flag --${name} given twice`);
    seen.set(name, flag);
  }
  return seen;
}

/** Instructions dockerfile-ast gives no flags to: a leading `--x` is still a flag to Docker. */
function refuseLeadingFlag(ctx: Ctx, keyword: string, instr: Instruction): void {
  const first = splitWords(content(instr))[0];
  if (first?.startsWith('--')) fail(ctx.line, `unknown flag for ${keyword}: ${first.split('=')[0]}`);
}

function properties(instr: Instruction): Property[] {
  const p = instr as Instruction & { getProperties?: () => Property[] };
  return typeof p.getProperties === 'function' ? p.getProperties() : [];
}

/** name=value pairs of ENV/LABEL (value raw: quotes and escapes are the engine's expansion's). */
function pairs(ctx: Ctx, instr: Instruction, keyword: string): [string, string][] {
  const props = properties(instr);
  if (props.length === 0) fail(ctx.line, `${keyword} needs at least one name=value pair`);
  return props.map((prop) => {
    const name = prop.getName();
    const value = prop.getUnescapedValue();
    if (value === null) fail(ctx.line, `${keyword} ${name}: missing value (${keyword} ${name}=value)`);
    if (name === '') fail(ctx.line, `${keyword}: empty name`);
    return [name, word(ctx, value)];
  });
}

interface StageHead {
  name?: string;
  line: number;
}

/** Parses a Dockerfile into the typed build spec, or throws a BuildSpecError naming the line. */
export function parseDockerfile(text: string, options: DockerfileOptions = {}): BuildSpec {
  if (Buffer.byteLength(text, 'utf8') > DOCKERFILE_MAX_BYTES) fail(undefined, `the Dockerfile is larger than ${DOCKERFILE_MAX_BYTES} bytes`);
  const buildArgs = options.args ?? {};
  for (const name of Object.keys(buildArgs)) {
    if (!ARG_NAME.test(name)) throw new BuildSpecError('args', undefined, `invalid build argument name: ${JSON.stringify(name)}`);
  }
  const source = text.startsWith('\uFEFF') ? text.slice(1) : text;
  const df = DockerfileParser.parse(source);

  for (const d of df.getDirectives()) {
    const line = d.getRange().start.line + 1;
    const name = d.getName().toLowerCase();
    const value = d.getValue();
    if (name === 'escape' && value !== '\\' && value !== '`') fail(line, `invalid escape directive ${JSON.stringify(value)}: only \\ or \` are allowed`);
    if (name === 'syntax' && !/^(docker\.io\/)?docker\/dockerfile(-upstream)?(:[\w.-]+)?(@sha256:[0-9a-f]{64})?$/.test(value)) {
      // Another frontend image would define another language; Nestbox implements Docker's own.
      fail(line, `syntax ${value}: only the standard Dockerfile syntax (docker/dockerfile) is supported`);
    }
  }
  const escape = df.getEscapeCharacter();

  const instructions = df.getInstructions();
  if (instructions.length === 0) fail(undefined, 'the Dockerfile is empty (it needs at least a FROM)');
  if (instructions.length > DOCKERFILE_MAX_INSTRUCTIONS) {
    fail(instructions[DOCKERFILE_MAX_INSTRUCTIONS]!.getRange().start.line + 1, `more than ${DOCKERFILE_MAX_INSTRUCTIONS} instructions`);
  }

  // Stage names first: a reference to a later stage is a mistake to name, not an image to pull.
  const heads: StageHead[] = [];
  for (const instr of instructions) {
    if (instr.getKeyword() !== 'FROM') continue;
    const words = splitWords(content(instr));
    heads.push({ line: instr.getRange().start.line + 1, name: words.length === 3 ? words[2]!.toLowerCase() : undefined });
  }
  if (heads.length === 0) fail(instructions[0]!.getRange().start.line + 1, 'the Dockerfile has no FROM');
  const stageIndexByName = (name: string): number | undefined => {
    const i = heads.findIndex((h) => h.name === name.toLowerCase());
    return i < 0 ? undefined : i;
  };

  // Global scope: ARGs before the first FROM, usable in FROM lines (build args override).
  const metaVars: Record<string, string> = { ...PLATFORM_ARGS };
  const globalDefaults: Record<string, string> = {};
  const stages: BuildStage[] = [];
  let stage: BuildStage | undefined;

  for (const instr of instructions) {
    const keyword = instr.getKeyword();
    const at = positionOf(instr);
    const ctx: Ctx = { escape, line: at.line };
    const push = (step: BuildStep) => stage!.steps.push(step);

    if (!stage && keyword !== 'ARG' && keyword !== 'FROM') {
      fail(ctx.line, `${keyword} before the first FROM (only ARG may come before FROM)`);
    }
    if (['RUN', 'COPY', 'ADD'].includes(keyword)) {
      const h = instr as Instruction & { getHeredocs?: () => unknown[] };
      if (typeof h.getHeredocs === 'function' && h.getHeredocs().length > 0) {
        fail(ctx.line, `heredocs (<<) are not supported in ${keyword}; write the file with COPY from the context, or use a RUN without <<`);
      }
    }

    switch (keyword) {
      case 'ARG': {
        refuseLeadingFlag(ctx, keyword, instr);
        const props = properties(instr);
        if (props.length === 0) fail(ctx.line, 'ARG needs a name');
        for (const prop of props) {
          const name = prop.getName();
          if (!ARG_NAME.test(name)) fail(ctx.line, `invalid ARG name ${JSON.stringify(name)}`);
          const raw = prop.getUnescapedValue();
          const def = raw === null ? undefined : word(ctx, raw);
          if (!stage) {
            if (def !== undefined) {
              const value = expandHere(ctx, raw!, metaVars);
              globalDefaults[name] = value;
            }
            const value = Object.prototype.hasOwnProperty.call(buildArgs, name) ? buildArgs[name] : (globalDefaults[name] ?? PLATFORM_ARGS[name]);
            if (value !== undefined) metaVars[name] = value;
            else delete metaVars[name];
          } else {
            // `ARG V` without a value inside a stage takes the global ARG's default (Docker's
            // rule; BuildKit's platform ARGs are global ARGs too). A build arg still wins.
            const inherited = def === undefined ? (globalDefaults[name] ?? PLATFORM_ARGS[name]) : undefined;
            const stepDefault = def ?? (inherited !== undefined ? quoteWord(inherited) : undefined);
            push({ at, kind: 'arg', name, ...(stepDefault !== undefined ? { default: stepDefault } : {}) });
          }
        }
        break;
      }
      case 'FROM': {
        const flags = checkFlags(ctx, keyword, flagsOf(instr), ['platform']);
        const platformFlag = flags.get('platform');
        const platformWord = platformFlag ? flagValue(ctx, platformFlag) : undefined;
        const words = splitWords(content(instr));
        if (!(words.length === 1 || (words.length === 3 && words[1]!.toLowerCase() === 'as'))) {
          fail(ctx.line, 'FROM takes an image and an optional AS <name>: FROM <image> [AS <name>]');
        }
        const index = stages.length;
        const reference = expandHere(ctx, words[0]!, metaVars);
        if (reference === '') fail(ctx.line, `FROM ${words[0]}: the image reference is empty`);
        let name: string | undefined;
        if (words.length === 3) {
          name = words[2]!.toLowerCase();
          if (!STAGE_NAME.test(name)) fail(ctx.line, `invalid stage name ${JSON.stringify(words[2])}: letters, digits, '.', '_' and '-', starting with a letter`);
          if (stages.some((s) => s.name === name)) fail(ctx.line, `duplicate stage name ${JSON.stringify(name)}`);
        }
        const from: BuildStage['from'] = { reference };
        if (platformWord !== undefined) {
          const platform = expandHere(ctx, platformWord, metaVars);
          if (platform !== 'linux/amd64') fail(ctx.line, `--platform=${platform}: Nestbox builds linux/amd64 images only`);
          from.platform = platform;
        }
        const target = stageIndexByName(reference);
        if (target !== undefined) {
          if (target >= index) fail(ctx.line, `FROM ${reference}: stage ${JSON.stringify(reference)} is not defined before this line`);
          from.stage = target;
        }
        stage = { index, ...(name ? { name } : {}), from, at, steps: [] };
        stages.push(stage);
        break;
      }
      case 'RUN': {
        checkFlags(ctx, keyword, flagsOf(instr), [], {
          mount: 'mounts (cache, secret, ssh, bind) are not supported; COPY what the step needs',
          network: 'per-step network modes are not supported (builds use the build egress policy)',
          security: 'insecure (privileged) steps are not supported',
        });
        push({ at, kind: 'run', command: commandForm(ctx, instr, keyword) });
        break;
      }
      case 'CMD':
      case 'ENTRYPOINT': {
        checkFlags(ctx, keyword, flagsOf(instr), []);
        push({ at, kind: keyword === 'CMD' ? 'cmd' : 'entrypoint', command: commandForm(ctx, instr, keyword) });
        break;
      }
      case 'SHELL': {
        checkFlags(ctx, keyword, flagsOf(instr), []);
        const argv = jsonArray(content(instr));
        if (!argv || argv.length === 0) fail(ctx.line, 'SHELL needs the JSON form with at least one element: SHELL ["/bin/sh", "-c"]');
        push({ at, kind: 'shell', argv });
        break;
      }
      case 'COPY':
      case 'ADD': {
        const isAdd = keyword === 'ADD';
        const refused: Record<string, string> = {
          parents: 'is not supported (copy each directory with its own COPY)',
          exclude: 'is not supported (use .dockerignore)',
        };
        if (isAdd) {
          refused.checksum = 'only applies to URL sources, which ADD in Nestbox does not fetch';
          refused['keep-git-dir'] = 'only applies to git sources, which ADD in Nestbox does not fetch';
        }
        const flags = checkFlags(ctx, keyword, flagsOf(instr), isAdd ? ['chown', 'chmod', 'link'] : ['from', 'chown', 'chmod', 'link'], refused);
        const link = flags.get('link');
        if (link && link.getValue() !== null && !['true', 'false'].includes(link.getValue()!)) {
          fail(ctx.line, `--link=${link.getValue()}: expected true or false`);
        }
        const words = pathWords(ctx, instr);
        if (words.length < 2) fail(ctx.line, `${keyword} needs at least one source and a destination`);
        const dest = words[words.length - 1]!;
        const sources = words.slice(0, -1);
        if (sources.length > 1 && !dest.endsWith('/') && !/\$/.test(dest)) {
          fail(ctx.line, `${keyword} with several sources needs a destination ending with /`);
        }
        const step: Extract<BuildStep, { kind: 'copy' }> = { at, kind: 'copy', sources, dest };
        if (isAdd) {
          for (const s of sources) {
            if (isRemoteSource(s)) {
              fail(ctx.line, `ADD ${s}: builds do not download through ADD; use RUN curl -fsSL -o <file> <url> (or git clone) instead`);
            }
          }
          step.extractArchives = true;
        }
        const fromFlag = flags.get('from');
        if (fromFlag) {
          const value = expandHere(ctx, flagValue(ctx, fromFlag), metaVars);
          const current = stage!.index;
          const byName = stageIndexByName(value);
          if (/^\d+$/.test(value)) {
            const i = Number(value);
            if (i >= current) fail(ctx.line, `--from=${value}: stage ${i} is not defined before this stage`);
            step.fromStage = i;
          } else if (byName !== undefined) {
            if (byName >= current) fail(ctx.line, `--from=${value}: stage ${JSON.stringify(value.toLowerCase())} is not defined before this stage`);
            step.fromStage = byName;
          } else {
            step.fromImage = value;
          }
        }
        const chown = flags.get('chown');
        if (chown) step.chown = word(ctx, flagValue(ctx, chown));
        const chmod = flags.get('chmod');
        if (chmod) {
          const mode = flagValue(ctx, chmod);
          if (!OCTAL_MODE.test(mode)) fail(ctx.line, `--chmod=${mode}: an octal mode is expected (e.g. 0755)`);
          step.chmod = mode;
        }
        push(step);
        break;
      }
      case 'ENV':
        refuseLeadingFlag(ctx, keyword, instr);
        push({ at, kind: 'env', vars: pairs(ctx, instr, keyword) });
        break;
      case 'LABEL':
        refuseLeadingFlag(ctx, keyword, instr);
        push({ at, kind: 'label', labels: pairs(ctx, instr, keyword) });
        break;
      case 'MAINTAINER': {
        const who = content(instr).trim();
        if (who === '') fail(ctx.line, 'MAINTAINER needs a name');
        // Docker's deprecated MAINTAINER is the `maintainer` label its docs recommend instead.
        push({ at, kind: 'label', labels: [['maintainer', quoteWord(who)]] });
        break;
      }
      case 'WORKDIR':
      case 'USER':
      case 'STOPSIGNAL': {
        refuseLeadingFlag(ctx, keyword, instr);
        // Docker reads the rest of the line as one word.
        const value = content(instr).trim();
        if (value === '') fail(ctx.line, `${keyword} needs a value`);
        const w = word(ctx, value);
        if (keyword === 'WORKDIR') push({ at, kind: 'workdir', path: w });
        else if (keyword === 'USER') push({ at, kind: 'user', user: w });
        else push({ at, kind: 'stopsignal', signal: w });
        break;
      }
      case 'EXPOSE': {
        refuseLeadingFlag(ctx, keyword, instr);
        const ports = splitWords(content(instr)).map((w) => word(ctx, w));
        if (ports.length === 0) fail(ctx.line, 'EXPOSE needs at least one port');
        for (const p of ports) {
          if (!p.includes('$') && !PORT.test(p)) fail(ctx.line, `EXPOSE ${p}: expected <port>[/tcp|/udp]`);
        }
        push({ at, kind: 'expose', ports });
        break;
      }
      case 'VOLUME': {
        checkFlags(ctx, keyword, flagsOf(instr), []);
        const paths = pathWords(ctx, instr);
        if (paths.length === 0) fail(ctx.line, 'VOLUME needs at least one path');
        push({ at, kind: 'volume', paths });
        break;
      }
      case 'HEALTHCHECK': {
        // HEALTHCHECK NONE (no health check) is what every Nestbox image has; a check Nestbox
        // would never run is refused rather than recorded and ignored.
        const words = splitWords(content(instr));
        if (flagsOf(instr).length === 0 && words.length === 1 && words[0]!.toUpperCase() === 'NONE') break;
        fail(ctx.line, 'HEALTHCHECK is not supported (sandboxes have no health checks); a start command with a readiness check is the Nestbox equivalent (native JSON steps: "start")');
      }
      case 'ONBUILD':
        fail(ctx.line, 'ONBUILD is not supported');
      default:
        fail(ctx.line, `unknown instruction ${instr.getInstruction()}`);
    }
  }

  return {
    stages,
    contexts: options.contexts ?? [],
    args: { ...buildArgs },
    ignore: options.ignore ?? [],
  };
}

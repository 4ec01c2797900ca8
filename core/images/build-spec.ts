// The typed form of an image build: what a Dockerfile (core/images/dockerfile.ts), the native
// API's JSON steps, E2B's template steps and Daytona's Image builder all become before the build
// engine (core/services/image-builds.ts) runs it. One shape, so the engine has one meaning per
// instruction and every front door is a translator onto it.
//
// Words are kept as written (no `$VAR` expansion): expansion needs the environment of the image a
// stage starts FROM, which only the engine knows (`expandWords` in dockerfile.ts does it then).

/** Where a spec instruction came from, for errors ("line 7: …") and build logs. */
export interface SourcePosition {
  /** 1-based line of a Dockerfile, or 1-based index of a JSON / SDK step. */
  line: number;
  /** The instruction as the user wrote it (one line, continuation lines joined), for logs. */
  text: string;
}

/**
 * What a stage starts from. A reference is resolved by the engine, in this order: `scratch`
 * (an empty tree), an earlier stage's name, one of the organisation's images (`name` or
 * `name:tag`, `default` included), else an OCI reference pulled from its registry.
 */
export interface StageFrom {
  reference: string;
  /** Index of an earlier stage when `reference` names one (resolved by the parser). */
  stage?: number;
  /** `--platform=` as written; only linux/amd64 (or none) is accepted by the parser. */
  platform?: string;
}

export interface BuildStage {
  /** 0-based. */
  index: number;
  /** `FROM … AS <name>` (lower-cased, as Docker compares them). */
  name?: string;
  from: StageFrom;
  at: SourcePosition;
  steps: BuildStep[];
}

/** Shell form (`RUN echo hi`, run by the stage's SHELL) or exec form (`RUN ["echo","hi"]`, argv). */
export type CommandForm = { shell: string } | { argv: string[] };

export type BuildStep = { at: SourcePosition; /** Skip the layer cache from this step on. */ noCache?: boolean } & (
  | {
      kind: 'run';
      command: CommandForm;
      /** Runs as this user instead of the stage's USER (E2B's per-step user). */
      user?: string;
    }
  | {
      kind: 'copy';
      /** Paths (globs allowed) relative to the context root, or to the stage's root with `fromStage`. */
      sources: string[];
      /** Absolute, or relative to the stage's WORKDIR. A trailing `/` makes it a directory. */
      dest: string;
      /** `COPY --from=<stage index>`. */
      fromStage?: number;
      /** `COPY --from=<image reference>` (not a stage): copied out of that image. */
      fromImage?: string;
      /**
       * Object keys of the context tars this step reads, merged in order (later wins). Absent:
       * the build's own `contexts`. E2B gives each COPY its own tar.
       */
      contexts?: string[];
      /** `user[:group]`, names or ids, resolved in the stage's /etc/passwd and /etc/group. */
      chown?: string;
      /** Octal mode applied to every copied file and directory, e.g. `0755`. */
      chmod?: string;
      /** ADD: a local tar archive (plain, gzip, bzip2, xz) source is extracted at `dest`. */
      extractArchives?: boolean;
    }
  | { kind: 'env'; /** In order; a later pair can refer to an earlier one. */ vars: [string, string][] }
  | { kind: 'arg'; name: string; default?: string }
  | { kind: 'workdir'; path: string }
  | { kind: 'user'; user: string }
  | { kind: 'shell'; argv: string[] }
  | { kind: 'label'; labels: [string, string][] }
  | { kind: 'expose'; ports: string[] }
  | { kind: 'volume'; paths: string[] }
  | { kind: 'stopsignal'; signal: string }
  | { kind: 'cmd'; command: CommandForm }
  | { kind: 'entrypoint'; command: CommandForm }
  /**
   * The start command sandboxes of the image run at start (detached, as the image's user, in
   * its WORKDIR), and the readiness check a create waits on (a shell command retried until it
   * exits 0). A Dockerfile's CMD/ENTRYPOINT are not a start command: they are metadata, as in
   * Docker, unless the front door says otherwise (E2B's fromDockerfile does).
   */
  | { kind: 'start'; command?: string; ready?: ReadyCheck }
);

export type BuildStepKind = BuildStep['kind'];

/** How a sandbox's start command is judged ready. */
export type ReadyCheck =
  | { kind: 'command'; command: string }
  | { kind: 'port'; port: number }
  | { kind: 'url'; url: string; status?: number }
  | { kind: 'process'; name: string }
  | { kind: 'file'; path: string }
  | { kind: 'delay'; ms: number };

export interface BuildSpec {
  /** The last stage is the image. */
  stages: BuildStage[];
  /** Object keys (core/services/object-store.ts) of context tars, merged in order into one tree. */
  contexts: string[];
  /** `--build-arg` values (ARG defaults otherwise). */
  args: Record<string, string>;
  /** Paths excluded from the context (.dockerignore syntax), applied to COPY sources. */
  ignore: string[];
}

/** A spec the parser refused: names the line and why (rendered as a 400 naming `field`). */
export class BuildSpecError extends Error {
  constructor(
    readonly field: string,
    readonly line: number | undefined,
    message: string,
  ) {
    super(line === undefined ? message : `line ${line}: ${message}`);
    this.name = 'BuildSpecError';
  }
}

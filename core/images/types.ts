// Images and builds as core keeps them (core/services/images.ts, image-builds.ts).
import type { BuildSpec, ReadyCheck } from './build-spec.js';
import type { EgressPolicy } from '../types.js';

/** What processes of a sandbox of the image start with, and what the image says about itself. */
export interface ImageConfig {
  /** In order (a later entry may refer to an earlier one when it was set). */
  env: [string, string][];
  /** Absolute; '' = the agent's default (the user's home, else /). */
  workdir: string;
  /** '' = root. */
  user: string;
  /** SHELL for shell-form commands (default ["/bin/sh", "-c"]). */
  shell: string[];
  cmd: string[] | null;
  entrypoint: string[] | null;
  exposedPorts: string[];
  labels: Record<string, string>;
  volumes: string[];
  stopSignal: string | null;
  /** Started at every sandbox's start, and judged ready by `ready`, before the create answers. */
  start: { command?: string; ready?: ReadyCheck } | null;
}

export const DEFAULT_SHELL = ['/bin/sh', '-c'];

export function emptyImageConfig(): ImageConfig {
  return { env: [], workdir: '', user: '', shell: [...DEFAULT_SHELL], cmd: null, entrypoint: null, exposedPorts: [], labels: {}, volumes: [], stopSignal: null, start: null };
}

export type ImageSource =
  | { kind: 'builtin' }
  | { kind: 'pull'; reference: string; digest: string }
  | { kind: 'build'; buildId: string; from: string[]; history?: BuildHistoryEntry[] };

/** One step of the build that made an image (its last stage), as Docker's `history` shows. */
export interface BuildHistoryEntry {
  step: number;
  stage: number;
  instruction: string;
  /** The layer the step wrote (a tree step), else null (a metadata step). */
  layer: string | null;
  /** A tree step answered from the cache. */
  cached?: boolean;
}

export interface Image {
  /** `img…`, or `default` for the built-in image. */
  id: string;
  organizationId: string;
  /** Repository name, e.g. `my-app` (tags are separate: `my-app:1`). */
  name: string;
  tags: string[];
  state: 'ready' | 'deleting';
  /** Where its base and layers are (null for the built-in image, on every host). */
  hostId: string | null;
  /** `default` or `sha256:<hex>` of the host's OCI store. */
  base: string;
  /** Top of the layer chain a build wrote (a `layer` snapshot); null: the base alone. */
  snapshotId: string | null;
  config: ImageConfig;
  source: ImageSource;
  buildId: string | null;
  sizeBytes: number | null;
  createdAt: Date;
}

export type BuildState = 'queued' | 'running' | 'succeeded' | 'failed' | 'cancelled';
export const FINISHED_BUILD_STATES: readonly BuildState[] = ['succeeded', 'failed', 'cancelled'];

export interface BuildOptions {
  /** Ignore the layer cache for every step (results are still cached). */
  noCache: boolean;
  /** The build sandbox's size. */
  cpu: number;
  memoryMiB: number;
  diskGiB: number;
  /** Whole build, steps included. */
  timeoutSeconds: number;
  /** Outbound network of the build's sandboxes (RUN steps). */
  egress: EgressPolicy;
  /** Credentials for pulling FROM images; never stored: kept only in the running build's memory. */
  hasCredentials: boolean;
  /** How long the start command may take to be ready at the end of the build. */
  readyTimeoutSeconds: number;
}

export interface BuildError {
  message: string;
  /** 1-based step over all stages (0: resolving a FROM; `finalize`: the start command's check). */
  step?: number | 'finalize';
  /** The Dockerfile line or JSON step index of that step. */
  line?: number;
  exitCode?: number;
  /** The last lines the step printed. */
  logTail?: string[];
  code?: string;
}

export interface ImageBuild {
  id: string;
  organizationId: string;
  name: string;
  tags: string[];
  state: BuildState;
  spec: BuildSpec;
  options: BuildOptions;
  error: BuildError | null;
  imageId: string | null;
  hostId: string | null;
  ownerInstanceId: string | null;
  cancelRequested: boolean;
  logCount: number;
  currentStep: number | null;
  totalSteps: number | null;
  createdAt: Date;
  startedAt: Date | null;
  finishedAt: Date | null;
}

export interface BuildLogLine {
  /** 0-based position in the build's log; resume a stream with `offset` = last + 1. */
  offset: number;
  at: Date;
  stream: 'system' | 'stdout' | 'stderr';
  text: string;
  /** 1-based step the line belongs to. */
  step?: number;
}

// The code interpreter's typed vocabulary (issue 15), shared by the guest agent's kernels, core's
// CodeInterpreterService and the three front doors (native API, compat/e2b, compat/daytona).
//
// A code context is one Jupyter kernel in a sandbox (the guest agent's kernel bridge drives it
// with jupyter_client: host/guest-agent/code-interpreter/). A cell's outcome is a stream of
// CodeEvents in Jupyter's own terms (stream, execute_result/display_data as a MIME bundle,
// error), so each front door maps them onto its vendor's shapes and nothing is lost on the way.
import type { Principal } from '../types.js';

/** The languages a context can speak; each is one kernel (see KERNEL_OF_LANGUAGE). */
export const CODE_LANGUAGES = ['python', 'javascript', 'typescript', 'bash', 'r'] as const;
export type CodeLanguage = (typeof CODE_LANGUAGES)[number];

/**
 * MIME types Nestbox's display hooks add to a result's bundle (the kernel-side extension of the
 * python kernel): a matplotlib figure's chart data (`Chart` below), and a pandas DataFrame's
 * columns (`to_dict(orient="list")`, timestamps as ISO strings).
 */
export const CHART_MIME = 'application/vnd.nestbox.chart+json';
export const DATAFRAME_MIME = 'application/vnd.nestbox.dataframe+json';

/**
 * A result's MIME bundle, as the kernel sent it: text types as strings (`text/plain`,
 * `text/html`, `text/markdown`, `text/latex`, `image/svg+xml`, `application/javascript`),
 * binary types base64 (`image/png`, `image/jpeg`, `application/pdf`), JSON types as values
 * (`application/json`, CHART_MIME, DATAFRAME_MIME, any `…+json`).
 */
export type MimeBundle = Record<string, unknown>;

/** One event of a running cell, in the order the kernel produced them. */
export type CodeEvent =
  /** The kernel took the cell: its execution count (Jupyter's `execute_input`). */
  | { type: 'start'; executionCount: number }
  /** One write to stdout or stderr, as the kernel reported it (never split by Nestbox). */
  | { type: 'stdout' | 'stderr'; text: string }
  /** `execute_result` (main: true, at most one per cell) or `display_data` (main: false). */
  | { type: 'result'; main: boolean; data: MimeBundle }
  /** An uncaught error; the traceback is one string (lines joined with "\n", ANSI colours kept). */
  | { type: 'error'; name: string; value: string; traceback: string }
  /**
   * The cell is over. `ok`/`error`: it ran to the end (with or without an uncaught error);
   * `interrupted`: its timeout or the caller's abort interrupted it, the context survives;
   * `lost`: the kernel died during the cell (os._exit, out of memory); the context's state is
   * gone and its next cell starts a fresh kernel.
   */
  | { type: 'end'; status: 'ok' | 'error' | 'interrupted' | 'lost'; executionCount?: number }
  /** Nothing happened for a while; streams pass it on as their own keep-alive. */
  | { type: 'keepalive' };

export interface CodeContext {
  id: string;
  language: CodeLanguage;
  cwd: string;
  /** The account the kernel runs as. */
  user: string;
  /** True for the per-language context a run without a context uses (`default-<language>`). */
  isDefault: boolean;
  createdAt: string;
}

export interface CreateContextInput {
  language?: CodeLanguage | string;
  cwd?: string;
  user?: string;
  /** Environment of every cell of the context (a run's `envs` override it for that run). */
  envs?: Record<string, string>;
}

export interface RunCodeInput {
  code: string;
  /** A context by id; else the default context of `language` (python when neither is given). */
  contextId?: string;
  language?: CodeLanguage | string;
  /** Environment variables for this run only; the context's own come back after it. */
  envs?: Record<string, string>;
  /** Interrupts the cell after this long (`end` with status `interrupted`); the context survives. */
  timeoutMs?: number;
  /** Account and cwd of the default context if this run has to start it. */
  user?: string;
  cwd?: string;
}

// ---- charts (the CHART_MIME payload) --------------------------------------------------------
// The shape is E2B's chart JSON (e2b-wave2.md §3.2), which is also what Daytona's charts carry
// (its composite type is spelled `composite_chart`, translated in compat/daytona).

export type ChartType = 'line' | 'scatter' | 'bar' | 'pie' | 'box_and_whisker' | 'superchart' | 'unknown';
export type ScaleType = 'linear' | 'datetime' | 'categorical' | 'log' | 'symlog' | 'logit' | 'function' | 'functionlog' | 'asinh';

export interface ChartBase {
  type: ChartType;
  title: string | null;
  elements: unknown[];
}
export interface Chart2D extends ChartBase {
  x_label: string | null;
  y_label: string | null;
  x_unit: string | null;
  y_unit: string | null;
}
export interface PointChart extends Chart2D {
  type: 'line' | 'scatter';
  x_ticks: (number | string)[];
  y_ticks: (number | string)[];
  x_tick_labels: string[];
  y_tick_labels: string[];
  x_scale: ScaleType;
  y_scale: ScaleType;
  elements: { label: string; points: [number | string, number | string][] }[];
}
export interface BarChart extends Chart2D {
  type: 'bar';
  elements: { label: string; group: string; value: number }[];
}
export interface PieChart extends ChartBase {
  type: 'pie';
  elements: { label: string; angle: number; radius: number }[];
}
export interface BoxAndWhiskerChart extends Chart2D {
  type: 'box_and_whisker';
  elements: { label: string; min: number; first_quartile: number; median: number; third_quartile: number; max: number; outliers: number[] }[];
}
export interface SuperChart extends ChartBase {
  type: 'superchart';
  elements: Chart[];
}
export type Chart = PointChart | BarChart | PieChart | BoxAndWhiskerChart | SuperChart | (ChartBase & { type: 'unknown' });

// ---- one-shot runs (Daytona's process.codeRun) ------------------------------------------------

export interface RunScriptInput {
  language: 'python' | 'javascript' | 'typescript';
  code: string;
  argv?: string[];
  envs?: Record<string, string>;
  cwd?: string;
  user?: string;
  timeoutMs?: number;
}

export interface RunScriptResult {
  /** The process's exit code; null when it was killed (timedOut) or could not start. */
  exitCode: number | null;
  /** stdout and stderr merged in the order they were written, chart lines removed. */
  output: string;
  /** One per figure a python script showed (plt.show()), with its PNG. */
  charts: (Chart & { png?: string })[];
  timedOut: boolean;
}

/** What core's CodeInterpreterService offers the front doors (each method checks `sandboxes:exec`). */
export interface CodeInterpreterPort {
  /** The languages this sandbox's image has kernels for (python needs only the default image). */
  languages(p: Principal, sandboxId: string): Promise<CodeLanguage[]>;
  createContext(p: Principal, sandboxId: string, input: CreateContextInput): Promise<CodeContext>;
  /** Running contexts, the started default contexts included. */
  listContexts(p: Principal, sandboxId: string): Promise<CodeContext[]>;
  getContext(p: Principal, sandboxId: string, contextId: string): Promise<CodeContext>;
  deleteContext(p: Principal, sandboxId: string, contextId: string): Promise<void>;
  /** A fresh kernel for the context: same id, language, cwd and user; its state is gone. */
  restartContext(p: Principal, sandboxId: string, contextId: string): Promise<CodeContext>;
  /**
   * Runs one cell; the generator ends after the `end` event. Aborting `o.signal` interrupts the
   * cell (the context survives). Cells of one context run one at a time, in order.
   */
  run(p: Principal, sandboxId: string, input: RunCodeInput, o?: { signal?: AbortSignal }): Promise<AsyncGenerator<CodeEvent>>;
  /** A program run once in a new process (Daytona's codeRun): exit code, merged output, charts. */
  runScript(p: Principal, sandboxId: string, input: RunScriptInput, o?: { signal?: AbortSignal }): Promise<RunScriptResult>;
}

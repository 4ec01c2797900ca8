// Daytona's `process.codeRun` (daytona-wave2 §4.1) over core's one-shot runner
// (`codeInterpreter.runScript`): the request is checked the way the daemon checks it, and the
// answer is Daytona's CodeRunResponse, with core's charts (E2B's chart JSON) reshaped into the
// chart objects Daytona's SDKs type.
import { errors } from '../../core/errors.js';
import type { Chart, RunScriptInput, RunScriptResult } from '../../core/code-interpreter/types.js';

/** The languages `codeRun` runs (the sandbox's `code-toolbox-language` label). */
const CODE_RUN_LANGUAGES = ['python', 'typescript', 'javascript'] as const;

/** A name a process environment can hold (what a shell can `export`). */
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** The fields of a code-run body, checked; errors name the field (400 in Daytona's shape). */
export function codeRunRequest(b: Record<string, unknown>): Pick<RunScriptInput, 'language' | 'code' | 'argv' | 'envs'> {
  if (typeof b.code !== 'string') throw errors.validation('code', b.code === undefined || b.code === null ? 'is required' : 'must be a string');
  const language = b.language === undefined || b.language === null ? 'python' : b.language;
  if (typeof language !== 'string' || !(CODE_RUN_LANGUAGES as readonly string[]).includes(language)) {
    throw errors.validation('language', `must be one of ${CODE_RUN_LANGUAGES.join(', ')}`);
  }
  let argv: string[] | undefined;
  if (b.argv !== undefined && b.argv !== null) {
    if (!Array.isArray(b.argv) || b.argv.some((a) => typeof a !== 'string')) throw errors.validation('argv', 'must be an array of strings');
    argv = b.argv as string[];
  }
  let envs: Record<string, string> | undefined;
  if (b.envs !== undefined && b.envs !== null) {
    if (typeof b.envs !== 'object' || Array.isArray(b.envs) || Object.values(b.envs).some((v) => typeof v !== 'string')) throw errors.validation('envs', 'must be an object of strings');
    const bad = Object.keys(b.envs).find((k) => !ENV_NAME.test(k));
    // The daemon refuses such a key with 400 rather than starting a process it cannot give it to.
    if (bad !== undefined) throw errors.validation('envs', `${JSON.stringify(bad)} is not a valid environment variable name (letters, digits and _, not starting with a digit)`);
    envs = b.envs as Record<string, string>;
  }
  return { language: language as RunScriptInput['language'], code: b.code, argv, envs };
}

/** Daytona's CodeRunResponse: merged output in `result`, the exit code (-1: it never started). */
export function codeRunResponse(r: RunScriptResult): Record<string, unknown> {
  return { exitCode: r.exitCode ?? -1, result: r.output, artifacts: { charts: r.charts.map(daytonaChart) } };
}

type Coordinate = number | string;

/** Days since 1970-01-01 UTC: matplotlib's own number for a date (its default epoch). */
const MS_PER_DAY = 86_400_000;

/**
 * One axis's coordinates as numbers. Daytona's Python client types ticks and points as numbers
 * only (pydantic, strict: one string fails the whole answer), while E2B's chart JSON carries
 * dates as ISO strings and categories as their names. Each becomes the number matplotlib itself
 * gives it on that axis: a date its day number, a category its position in order of first use.
 */
function axisNumbers(scale: string | undefined): (v: Coordinate) => number {
  const categories = new Map<string, number>();
  return (v) => {
    if (typeof v === 'number') return v;
    if (scale === 'datetime') {
      // An ISO time without a zone is UTC here, as the extractor wrote it (JS would read it as local).
      const t = Date.parse(/T[\d:.]+$/.test(v) ? `${v}Z` : v);
      if (!Number.isNaN(t)) return t / MS_PER_DAY;
    }
    const n = Number(v);
    if (v.trim() !== '' && Number.isFinite(n)) return n;
    if (!categories.has(v)) categories.set(v, categories.size);
    return categories.get(v)!;
  };
}

const text = (v: unknown): string => (v === undefined || v === null ? '' : String(v));
const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : v === null || v === undefined ? null : Number.isFinite(Number(v)) ? Number(v) : null);

/**
 * A chart as Daytona's SDKs read it (daytona-wave2 §4.1). From E2B's shape: the composite type
 * is `composite_chart` (E2B's `superchart`) whose elements are sub-charts without a PNG, a bar's
 * `value` is the typed string, ticks and points are numbers (axisNumbers), and E2B's
 * `x_unit`/`y_unit` (not in Daytona's types) are left out. The PNG is on the top-level chart.
 */
export function daytonaChart(chart: Chart & { png?: string }): Record<string, unknown> {
  const out = reshape(chart);
  if (chart.png) out.png = chart.png;
  return out;
}

function reshape(chart: Chart): Record<string, unknown> {
  const c = chart as Chart & Record<string, unknown>;
  const head = { type: chart.type === 'superchart' ? 'composite_chart' : chart.type, title: chart.title ?? null };
  const labels = { x_label: c.x_label ?? null, y_label: c.y_label ?? null };
  switch (chart.type) {
    case 'line':
    case 'scatter': {
      const x = axisNumbers(chart.x_scale);
      const y = axisNumbers(chart.y_scale);
      // Points first: matplotlib numbers categories in the order the data uses them.
      const elements = (chart.elements ?? []).map((e) => ({ label: text(e.label), points: (e.points ?? []).map(([px, py]) => [x(px), y(py)]) }));
      return {
        ...head,
        ...labels,
        x_ticks: (chart.x_ticks ?? []).map(x),
        x_tick_labels: (chart.x_tick_labels ?? []).map(text),
        x_scale: chart.x_scale,
        y_ticks: (chart.y_ticks ?? []).map(y),
        y_tick_labels: (chart.y_tick_labels ?? []).map(text),
        y_scale: chart.y_scale,
        elements,
      };
    }
    case 'bar':
      return { ...head, ...labels, elements: (chart.elements ?? []).map((e) => ({ label: text(e.label), group: text(e.group), value: text(e.value) })) };
    case 'pie':
      return { ...head, elements: (chart.elements ?? []).map((e) => ({ label: text(e.label), angle: num(e.angle), radius: num(e.radius) })) };
    case 'box_and_whisker':
      return {
        ...head,
        ...labels,
        elements: (chart.elements ?? []).map((e) => ({
          label: text(e.label),
          min: num(e.min),
          first_quartile: num(e.first_quartile),
          median: num(e.median),
          third_quartile: num(e.third_quartile),
          max: num(e.max),
          outliers: (e.outliers ?? []).map(num).filter((o): o is number => o !== null),
        })),
      };
    case 'superchart':
      return { ...head, elements: (chart.elements ?? []).map((sub) => reshape(sub)) };
    default:
      return { ...head, type: 'unknown', elements: [] };
  }
}

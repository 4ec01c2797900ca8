// A cell's events (core's CodeEvent, in Jupyter's terms) as the lines of E2B's `/execute`
// NDJSON stream (e2b.md (e), e2b-wave2.md §3): the only place that knows E2B's result keys.
import { CHART_MIME, DATAFRAME_MIME, type CodeEvent, type MimeBundle } from '../../../core/code-interpreter/types.js';

/** One line of the stream, before JSON.stringify. */
export type ExecuteLine = Record<string, unknown> & { type: string };

/**
 * Jupyter MIME type → the key E2B's SDKs read it under. `text/plain` is handled on its own (its
 * quotes), the two Nestbox display-hook types are E2B's `data` (a DataFrame's columns) and
 * `chart`; every other MIME type of the bundle goes into `extra`, as upstream.
 */
const KEY_OF_MIME: Record<string, string> = {
  'text/html': 'html',
  'text/markdown': 'markdown',
  'image/svg+xml': 'svg',
  'image/png': 'png',
  'image/jpeg': 'jpeg',
  'application/pdf': 'pdf',
  'text/latex': 'latex',
  'application/json': 'json',
  'application/javascript': 'javascript',
  [DATAFRAME_MIME]: 'data',
  [CHART_MIME]: 'chart',
};

/**
 * `text/plain` as E2B shows it: one pair of surrounding quotes is removed, so a string result's
 * text is the string (`'bar'` from IPython, `"/home/user"` from Deno's kernel) as upstream does.
 */
export function plainText(text: string): string {
  if (text.length >= 2 && (text[0] === "'" || text[0] === '"') && text.endsWith(text[0])) return text.slice(1, -1);
  return text;
}

/** A result's MIME bundle as the fields of E2B's `result` line (absent formats are left out). */
export function resultFields(data: MimeBundle): Record<string, unknown> {
  const fields: Record<string, unknown> = {};
  const extra: Record<string, unknown> = {};
  for (const [mime, value] of Object.entries(data)) {
    if (mime === 'text/plain') {
      if (typeof value === 'string') fields.text = plainText(value);
      continue;
    }
    const key = KEY_OF_MIME[mime];
    if (key) fields[key] = value;
    else extra[mime] = value;
  }
  if (Object.keys(extra).length > 0) fields.extra = extra;
  return fields;
}

/**
 * The E2B lines of one event. `end` gives `end_of_execution`, after an `UnexpectedEndOfExecution`
 * error when the kernel died during the cell (upstream's name for a cell whose kernel went away).
 * An interrupted cell's stream is over for a client that is gone already; one still listening
 * (a server-side interrupt) is told its cell ended.
 */
export function linesOf(event: CodeEvent, now: () => Date = () => new Date()): ExecuteLine[] {
  switch (event.type) {
    case 'start':
      return [{ type: 'number_of_executions', execution_count: event.executionCount }];
    case 'stdout':
    case 'stderr':
      return [{ type: event.type, text: event.text, timestamp: now().toISOString() }];
    case 'result':
      return [{ type: 'result', ...resultFields(event.data), is_main_result: event.main }];
    case 'error':
      return [{ type: 'error', name: event.name, value: event.value, traceback: event.traceback }];
    case 'keepalive':
      return [{ type: 'keepalive' }];
    case 'end':
      if (event.status === 'lost') {
        return [
          { type: 'error', name: 'UnexpectedEndOfExecution', value: "the code context's kernel exited during the execution; its state is lost", traceback: '' },
          { type: 'end_of_execution' },
        ];
      }
      return [{ type: 'end_of_execution' }];
  }
}

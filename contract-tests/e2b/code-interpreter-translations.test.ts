// The E2B code interpreter's pure translations (compat/e2b/code-interpreter/results.ts and
// contexts.ts): core's cell events → E2B's /execute lines. Needs no sandbox; what the SDKs make
// of the lines is in code-interpreter.test.ts and the Python suite.
import { describe, expect, it } from 'vitest';
import { linesOf, plainText, resultFields } from '../../compat/e2b/code-interpreter/results.js';
import { normalizeLanguage } from '../../compat/e2b/code-interpreter/contexts.js';
import { CHART_MIME, DATAFRAME_MIME } from '../../core/code-interpreter/types.js';

const at = () => new Date('2026-01-01T00:00:00.000Z');

describe('E2B result lines from Jupyter MIME bundles', () => {
  it('maps every MIME type onto its E2B key, the rest into extra', () => {
    const chart = { type: 'line', title: 't', elements: [] };
    const fields = resultFields({
      'text/plain': "'quoted'",
      'text/html': '<b>h</b>',
      'text/markdown': '**m**',
      'image/svg+xml': '<svg/>',
      'image/png': 'iVBOR',
      'image/jpeg': '/9j/',
      'application/pdf': 'JVBER',
      'text/latex': '$x$',
      'application/json': { a: 1 },
      'application/javascript': 'alert(1)',
      [DATAFRAME_MIME]: { a: [1, 2] },
      [CHART_MIME]: chart,
      'application/vnd.custom+json': { c: true },
    });
    expect(fields).toEqual({
      text: 'quoted',
      html: '<b>h</b>',
      markdown: '**m**',
      svg: '<svg/>',
      png: 'iVBOR',
      jpeg: '/9j/',
      pdf: 'JVBER',
      latex: '$x$',
      json: { a: 1 },
      javascript: 'alert(1)',
      data: { a: [1, 2] },
      chart,
      extra: { 'application/vnd.custom+json': { c: true } },
    });
    // A result's line: E2B's keys beside `is_main_result`.
    expect(linesOf({ type: 'result', main: true, data: { 'text/plain': '2', 'text/html': '<b>2</b>', [CHART_MIME]: chart } })).toEqual([
      { type: 'result', text: '2', html: '<b>2</b>', chart, is_main_result: true },
    ]);
  });

  it('strips one pair of surrounding quotes from text/plain, as upstream', () => {
    expect(plainText("'bar'")).toBe('bar');
    expect(plainText('"/home/user"')).toBe('/home/user');
    expect(plainText("''x''")).toBe("'x'");
    expect(plainText('\'mixed"')).toBe('\'mixed"');
    expect(plainText("'")).toBe("'");
    expect(plainText('[1] "a"')).toBe('[1] "a"');
  });

  it('maps the cell events onto E2B line types', () => {
    expect(linesOf({ type: 'start', executionCount: 3 })).toEqual([{ type: 'number_of_executions', execution_count: 3 }]);
    expect(linesOf({ type: 'stdout', text: 'a\n' }, at)).toEqual([{ type: 'stdout', text: 'a\n', timestamp: '2026-01-01T00:00:00.000Z' }]);
    expect(linesOf({ type: 'stderr', text: 'b\n' }, at)).toEqual([{ type: 'stderr', text: 'b\n', timestamp: '2026-01-01T00:00:00.000Z' }]);
    expect(linesOf({ type: 'result', main: false, data: { 'image/png': 'x' } })).toEqual([{ type: 'result', png: 'x', is_main_result: false }]);
    expect(linesOf({ type: 'error', name: 'E', value: 'v', traceback: 'tb' })).toEqual([{ type: 'error', name: 'E', value: 'v', traceback: 'tb' }]);
    expect(linesOf({ type: 'keepalive' })).toEqual([{ type: 'keepalive' }]);
    for (const status of ['ok', 'error', 'interrupted'] as const) expect(linesOf({ type: 'end', status })).toEqual([{ type: 'end_of_execution' }]);
    const lost = linesOf({ type: 'end', status: 'lost' });
    expect(lost.map((l) => l.type)).toEqual(['error', 'end_of_execution']);
    expect(lost[0].name).toBe('UnexpectedEndOfExecution');
  });
});

describe('E2B language names', () => {
  it('normalises as upstream: trimmed, lower-case, js/ts spelled out, empty is python', () => {
    expect(normalizeLanguage(undefined)).toBe('python');
    expect(normalizeLanguage('')).toBe('python');
    expect(normalizeLanguage('  Python ')).toBe('python');
    expect(normalizeLanguage('JS')).toBe('javascript');
    expect(normalizeLanguage('ts')).toBe('typescript');
    expect(normalizeLanguage('deno')).toBe('typescript');
    expect(normalizeLanguage('R')).toBe('r');
    expect(normalizeLanguage('bash')).toBe('bash');
    expect(normalizeLanguage('java')).toBe('java');
  });
});

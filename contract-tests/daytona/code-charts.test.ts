// The chart translation of codeRun (compat/daytona/code-run.ts): core's charts (E2B's chart JSON)
// into Daytona's chart objects. The cases the SDK tests cannot reach cheaply: dates and categories
// on a line chart's axes (Daytona's Python client takes numbers only: one string there fails the
// whole answer), box plots and unknown figures. A pure function: no server, no sandbox.
import { describe, expect, it } from 'vitest';
import type { Chart } from '../../core/code-interpreter/types.js';
import { codeRunRequest, codeRunResponse, daytonaChart } from '../../compat/daytona/code-run.js';

const axes = { x_label: 'when', y_label: 'n', x_unit: null, y_unit: null };

describe('daytonaChart', () => {
  it('gives dates their matplotlib day numbers and categories their positions, ticks included', () => {
    const chart: Chart = {
      type: 'line',
      title: 'T',
      ...axes,
      x_ticks: ['1970-01-02T00:00:00', '1970-01-03T00:00:00'],
      y_ticks: [0, 5],
      x_tick_labels: ['Jan 02', 'Jan 03'],
      y_tick_labels: ['0', '5'],
      x_scale: 'datetime',
      y_scale: 'linear',
      elements: [{ label: 's', points: [['1970-01-02T00:00:00', 1], ['1970-01-03T12:00:00', 2]] }],
    };
    const out = daytonaChart({ ...chart, png: 'iVBOR' });
    expect(out).toEqual({
      type: 'line',
      title: 'T',
      x_label: 'when',
      y_label: 'n',
      x_ticks: [1, 2],
      x_tick_labels: ['Jan 02', 'Jan 03'],
      x_scale: 'datetime',
      y_ticks: [0, 5],
      y_tick_labels: ['0', '5'],
      y_scale: 'linear',
      elements: [{ label: 's', points: [[1, 1], [2.5, 2]] }],
      png: 'iVBOR',
    });
    const categorical = daytonaChart({ ...chart, x_scale: 'categorical', x_ticks: [0, 1], elements: [{ label: 'c', points: [['b', 1], ['a', 2], ['b', 3]] }] });
    expect(categorical.elements).toEqual([{ label: 'c', points: [[0, 1], [1, 2], [0, 3]] }]);
  });

  it('renames the supergraph composite_chart, keeps the PNG on top only, and types bar values as strings', () => {
    const bar: Chart = { type: 'bar', title: null, ...axes, elements: [{ label: 'a', group: 'g', value: 3.5 }] };
    const pie: Chart = { type: 'pie', title: 'p', elements: [{ label: 'x', angle: 90, radius: 1 }] };
    const out = daytonaChart({ type: 'superchart', title: 'S', elements: [bar, pie], png: 'PNG' });
    expect(out).toEqual({
      type: 'composite_chart',
      title: 'S',
      png: 'PNG',
      elements: [
        { type: 'bar', title: null, x_label: 'when', y_label: 'n', elements: [{ label: 'a', group: 'g', value: '3.5' }] },
        { type: 'pie', title: 'p', elements: [{ label: 'x', angle: 90, radius: 1 }] },
      ],
    });
  });

  it('keeps a box plot\'s numbers and an unknown figure as type unknown', () => {
    const box: Chart = { type: 'box_and_whisker', title: 'B', ...axes, elements: [{ label: 'l', min: 1, first_quartile: 2, median: 3, third_quartile: 4, max: 5, outliers: [9] }] };
    expect(daytonaChart(box).elements).toEqual([{ label: 'l', min: 1, first_quartile: 2, median: 3, third_quartile: 4, max: 5, outliers: [9] }]);
    expect(daytonaChart({ type: 'unknown', title: null, elements: [] })).toEqual({ type: 'unknown', title: null, elements: [] });
  });
});

describe('codeRun request and response', () => {
  it('checks the body the way the daemon does, naming the field', () => {
    expect(codeRunRequest({ code: 'x', language: 'typescript', argv: ['a'], envs: { A_1: 'v' } })).toEqual({ code: 'x', language: 'typescript', argv: ['a'], envs: { A_1: 'v' } });
    expect(codeRunRequest({ code: 'x' }).language).toBe('python');
    expect(() => codeRunRequest({})).toThrow(/code: is required/);
    expect(() => codeRunRequest({ code: 'x', language: 'ruby' })).toThrow(/language: must be one of python, typescript, javascript/);
    expect(() => codeRunRequest({ code: 'x', argv: [1] })).toThrow(/argv: must be an array of strings/);
    expect(() => codeRunRequest({ code: 'x', envs: { '1A': 'v' } })).toThrow(/envs: "1A" is not a valid environment variable name/);
    expect(() => codeRunRequest({ code: 'x', envs: { A: 1 } })).toThrow(/envs: must be an object of strings/);
  });

  it('answers -1 for a run that never started', () => {
    expect(codeRunResponse({ exitCode: null, output: 'no such interpreter\n', charts: [], timedOut: false })).toEqual({ exitCode: -1, result: 'no such interpreter\n', artifacts: { charts: [] } });
  });
});

// A single `Range: bytes=…` request (RFC 9110 §14). Multi-range requests and syntactically
// invalid headers are ignored, as the RFC allows, and answered with the whole file; that keeps
// the agent simple without ever answering a valid request wrongly.

export interface ByteRange {
  start: number;
  /** Inclusive. */
  end: number;
}

export type RangeResult =
  | { kind: 'full' }
  | { kind: 'partial'; range: ByteRange }
  | { kind: 'unsatisfiable' };

const SINGLE_RANGE = /^bytes=(\d*)-(\d*)$/;

export function parseRangeHeader(header: string | undefined, size: number): RangeResult {
  if (header === undefined) return { kind: 'full' };
  const match = SINGLE_RANGE.exec(header.trim());
  if (!match) return { kind: 'full' };
  const [, firstText, lastText] = match;
  if (firstText === '' && lastText === '') return { kind: 'full' };

  if (firstText === '') {
    // Suffix range: the last N bytes.
    const suffixLength = Number(lastText);
    if (suffixLength === 0 || size === 0) return { kind: 'unsatisfiable' };
    return { kind: 'partial', range: { start: Math.max(0, size - suffixLength), end: size - 1 } };
  }

  const start = Number(firstText);
  const requestedEnd = lastText === '' ? Number.POSITIVE_INFINITY : Number(lastText);
  if (requestedEnd < start) return { kind: 'full' };
  if (start >= size) return { kind: 'unsatisfiable' };
  return { kind: 'partial', range: { start, end: Math.min(requestedEnd, size - 1) } };
}

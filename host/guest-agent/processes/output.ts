// GET /processes/{id}/output: a bounded read of both streams from the caller's offsets.
import type { OutputEncoding, OutputResponse } from '../../agent-protocol/processes.js';
import { validationFailed } from '../errors.js';
import type { ManagedProcess, StreamName } from './managed-process.js';
import { completeUtf8Length, type RetainedOutput } from './output-buffer.js';

export const DEFAULT_MAX_OUTPUT_BYTES = 1024 * 1024;
const MAX_OUTPUT_BYTES = 64 * 1024 * 1024;
/** The longest UTF-8 character. */
const MAX_CHARACTER_BYTES = 4;

export function parseOffset(query: URLSearchParams, name: string): number | undefined {
  const raw = query.get(name);
  if (raw === null || raw === '') return undefined;
  if (!/^\d+$/.test(raw) || !Number.isSafeInteger(Number(raw))) throw validationFailed(name, `must be a non-negative integer, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

/** stdoutOffset/stderrOffset, with `offset` as the default for both. */
export function parseOffsets(query: URLSearchParams): Record<StreamName, number> {
  const both = parseOffset(query, 'offset') ?? 0;
  return { stdout: parseOffset(query, 'stdoutOffset') ?? both, stderr: parseOffset(query, 'stderrOffset') ?? both };
}

function parseEncoding(query: URLSearchParams): OutputEncoding {
  const raw = query.get('encoding') ?? 'utf8';
  if (raw !== 'utf8' && raw !== 'base64') throw validationFailed('encoding', `must be utf8 or base64, got ${JSON.stringify(raw)}`);
  return raw;
}

function parseMaxBytes(query: URLSearchParams): number {
  const value = parseOffset(query, 'maxBytes') ?? DEFAULT_MAX_OUTPUT_BYTES;
  if (value < 1 || value > MAX_OUTPUT_BYTES) throw validationFailed('maxBytes', `must be from 1 to ${MAX_OUTPUT_BYTES}`);
  return value;
}

function readStream(output: RetainedOutput, offset: number, maxBytes: number, encoding: OutputEncoding, ended: boolean): { text: string; next: number } {
  const { start, data } = output.read(offset, maxBytes);
  if (encoding === 'base64') return { text: data.toString('base64'), next: start + data.length };
  // A character whose last bytes are not here yet (beyond maxBytes, or not yet written) is left
  // for the next read; once the process has ended nothing more will come, so the tail goes out.
  const everything = ended && start + data.length >= output.total;
  let kept = everything ? data : data.subarray(0, completeUtf8Length(data));
  if (kept.length === 0 && data.length > 0 && data.length < MAX_CHARACTER_BYTES) {
    // maxBytes is smaller than the next character: hand out that one character anyway.
    const wider = output.read(start, MAX_CHARACTER_BYTES).data;
    const lead = wider[0];
    const characterLength = lead < 0xc0 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : lead < 0xf8 ? 4 : 1;
    kept = wider.length >= characterLength ? wider.subarray(0, characterLength) : kept;
  }
  return { text: kept.toString('utf8'), next: start + kept.length };
}

export function readOutput(process: ManagedProcess, query: URLSearchParams): OutputResponse {
  const offsets = parseOffsets(query);
  const encoding = parseEncoding(query);
  const maxBytes = parseMaxBytes(query);
  // All synchronous: the state reported and the output read are of the same moment.
  const ended = !process.running;
  const stdout = readStream(process.stdout, offsets.stdout, maxBytes, encoding, ended);
  const stderr = readStream(process.stderr, offsets.stderr, maxBytes, encoding, ended);
  return {
    stdout: stdout.text,
    stderr: stderr.text,
    stdoutOffset: stdout.next,
    stderrOffset: stderr.next,
    stdoutRetainedFrom: process.stdout.retainedFrom,
    stderrRetainedFrom: process.stderr.retainedFrom,
    encoding,
    status: ended ? process.status : 'running',
    exitCode: ended ? process.exitCode : null,
    signal: ended ? process.signal : null,
  };
}

// One output stream of a process (stdout or stderr), retained in memory up to a bound so that
// clients can read it by absolute offset, reconnect, and replay.
//
// Bytes are stored in chunks tagged with a per-process sequence number: the sequence of the
// append that started the chunk. Readers that follow both streams use it to replay stdout and
// stderr in the order the process produced them. Consecutive appends to the same stream with
// nothing in between on the other stream are merged into one chunk, so a process that prints
// one line at a time does not cost one object per line.

const CHUNK_CAPACITY = 16 * 1024;
/** Per-chunk bookkeeping counted against the bound, so many tiny chunks cannot escape it. */
const CHUNK_OVERHEAD = 64;

interface Chunk {
  /** Absolute offset of data[0]. */
  start: number;
  /** Backing storage; only the first `length` bytes are data. */
  buffer: Buffer;
  /** First valid byte in `buffer` (moves when the head of the oldest chunk is dropped). */
  head: number;
  length: number;
  seq: number;
}

export interface OutputSlice {
  /** Absolute offset of the first byte of `data`. */
  start: number;
  data: Buffer;
  /** Sequence number of the append that produced the first byte. */
  seq: number;
}

export class RetainedOutput {
  private chunks: Chunk[] = [];
  /** Index of the oldest live chunk; dropped chunks are compacted away lazily. */
  private first = 0;
  private accounted = 0;
  private lastAppendSeq = -1;
  /** Total bytes ever written to the stream: the offset the next byte will get. */
  total = 0;
  /** Offset of the oldest byte still held. */
  retainedFrom = 0;

  constructor(private readonly maxRetainedBytes: number) {}

  append(data: Buffer, seq: number): void {
    if (data.length === 0) return;
    let rest = data;
    const last = this.chunks.length > this.first ? this.chunks[this.chunks.length - 1] : undefined;
    if (last && this.lastAppendSeq === seq - 1) {
      const room = last.buffer.length - (last.head + last.length);
      const taken = Math.min(room, rest.length);
      if (taken > 0) {
        rest.copy(last.buffer, last.head + last.length, 0, taken);
        last.length += taken;
        this.accounted += taken;
        rest = rest.subarray(taken);
      }
    } else if (last) {
      this.shrinkToFit(last);
    }
    while (rest.length > 0) {
      const buffer = Buffer.allocUnsafe(Math.max(CHUNK_CAPACITY, Math.min(rest.length, 1024 * 1024)));
      const taken = Math.min(buffer.length, rest.length);
      rest.copy(buffer, 0, 0, taken);
      this.chunks.push({ start: this.total + (data.length - rest.length), buffer, head: 0, length: taken, seq });
      this.accounted += taken + CHUNK_OVERHEAD;
      rest = rest.subarray(taken);
    }
    this.total += data.length;
    this.lastAppendSeq = seq;
    this.enforceBound();
  }

  /** The retained bytes from `offset` (clamped up to retainedFrom), within the chunk holding it. */
  chunkAt(offset: number, maxBytes: number): OutputSlice | undefined {
    const from = Math.max(offset, this.retainedFrom);
    if (from >= this.total) return undefined;
    const chunk = this.chunks[this.indexOf(from)];
    const skip = from - chunk.start;
    const length = Math.min(chunk.length - skip, maxBytes);
    const begin = chunk.head + skip;
    // A copy: the chunk's buffer may still be appended to or trimmed while the slice is in use.
    return { start: from, data: Buffer.from(chunk.buffer.subarray(begin, begin + length)), seq: chunk.seq };
  }

  /** Up to maxBytes retained bytes from `offset` (clamped up to retainedFrom), across chunks. */
  read(offset: number, maxBytes: number): { start: number; data: Buffer } {
    const start = Math.max(offset, this.retainedFrom);
    const parts: Buffer[] = [];
    let position = start;
    let remaining = maxBytes;
    while (remaining > 0) {
      const slice = this.chunkAt(position, remaining);
      if (!slice) break;
      parts.push(slice.data);
      position += slice.data.length;
      remaining -= slice.data.length;
    }
    return { start, data: Buffer.concat(parts) };
  }

  /** Everything retained, e.g. for a synchronous session command's answer. */
  readAll(): Buffer {
    return this.read(this.retainedFrom, this.total - this.retainedFrom).data;
  }

  private indexOf(offset: number): number {
    let low = this.first;
    let high = this.chunks.length - 1;
    while (low < high) {
      const middle = (low + high + 1) >> 1;
      if (this.chunks[middle].start <= offset) low = middle;
      else high = middle - 1;
    }
    return low;
  }

  /** A chunk that will get no more appends gives back its spare capacity. */
  private shrinkToFit(chunk: Chunk): void {
    if (chunk.buffer.length - chunk.length < 1024) return;
    chunk.buffer = Buffer.from(chunk.buffer.subarray(chunk.head, chunk.head + chunk.length));
    chunk.head = 0;
  }

  private enforceBound(): void {
    while (this.accounted > this.maxRetainedBytes && this.chunks.length > this.first) {
      const oldest = this.chunks[this.first];
      const excess = this.accounted - this.maxRetainedBytes;
      if (excess >= oldest.length + CHUNK_OVERHEAD || oldest.length <= excess) {
        this.first += 1;
        this.accounted -= oldest.length + CHUNK_OVERHEAD;
      } else {
        oldest.head += excess;
        oldest.start += excess;
        oldest.length -= excess;
        this.accounted -= excess;
      }
    }
    this.retainedFrom = this.chunks.length > this.first ? this.chunks[this.first].start : this.total;
    if (this.first > 1024 && this.first * 2 > this.chunks.length) {
      this.chunks = this.chunks.slice(this.first);
      this.first = 0;
    }
  }
}

/**
 * How many leading bytes of `data` end on a UTF-8 character boundary: a multi-byte character
 * whose last bytes are not in `data` yet is left out entirely. Invalid bytes count as
 * complete (they decode to U+FFFD), so a reader always makes progress past them.
 */
export function completeUtf8Length(data: Buffer): number {
  const end = data.length;
  for (let index = end - 1; index >= 0 && index >= end - 4; index -= 1) {
    const byte = data[index];
    if ((byte & 0xc0) === 0x80) continue; // a continuation byte: keep looking for the lead
    const needed = byte < 0xc0 ? 1 : byte < 0xe0 ? 2 : byte < 0xf0 ? 3 : byte < 0xf8 ? 4 : 1;
    return end - index < needed ? index : end;
  }
  return end;
}

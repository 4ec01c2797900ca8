import { describe, expect, it } from 'vitest';
import { MarkerScanner } from './marker-scanner.js';
import { completeUtf8Length, RetainedOutput } from './output-buffer.js';

describe('RetainedOutput', () => {
  it('reads by absolute offset across merged and separate chunks', () => {
    const output = new RetainedOutput(1024 * 1024);
    output.append(Buffer.from('hello '), 1);
    output.append(Buffer.from('world'), 2); // merged: nothing else appended in between
    output.append(Buffer.from('!'), 4); // a new chunk: seq 3 went to the other stream
    expect(output.total).toBe(12);
    expect(output.read(0, 100).data.toString()).toBe('hello world!');
    expect(output.read(6, 3).data.toString()).toBe('wor');
    expect(output.chunkAt(0, 100)).toMatchObject({ start: 0, seq: 1 });
    expect(output.chunkAt(11, 100)).toMatchObject({ start: 11, seq: 4 });
    expect(output.chunkAt(12, 100)).toBeUndefined();
  });

  it('drops the oldest bytes beyond the bound and advances retainedFrom', () => {
    const output = new RetainedOutput(4096);
    let expected = '';
    for (let index = 0; index < 2000; index += 1) {
      const line = `${index}\n`;
      expected += line;
      output.append(Buffer.from(line), index * 2 + 1); // never merged: worst case for overhead
    }
    expect(output.total).toBe(Buffer.byteLength(expected));
    expect(output.retainedFrom).toBeGreaterThan(0);
    const { start, data } = output.read(0, 1 << 20);
    expect(start).toBe(output.retainedFrom);
    expect(data.toString()).toBe(expected.slice(output.retainedFrom));
  });

  it('trims inside a single huge chunk', () => {
    const output = new RetainedOutput(1000);
    output.append(Buffer.alloc(5000, 'x'), 1);
    expect(output.retainedFrom).toBeGreaterThanOrEqual(4000);
    expect(output.read(0, 10_000).data.length).toBe(5000 - output.retainedFrom);
  });
});

describe('completeUtf8Length', () => {
  const euro = Buffer.from('€'); // 3 bytes
  it.each([
    ['ascii', Buffer.from('abc'), 3],
    ['a whole multi-byte character', Buffer.concat([Buffer.from('a'), euro]), 4],
    ['a character missing its last byte', Buffer.concat([Buffer.from('a'), euro.subarray(0, 2)]), 1],
    ['only a lead byte', Buffer.concat([Buffer.from('ab'), euro.subarray(0, 1)]), 2],
    ['a 4-byte emoji cut after 3', Buffer.from('😀').subarray(0, 3), 0],
    ['stray continuation bytes', Buffer.from([0x80, 0x80]), 2],
  ])('%s', (_name, data, expected) => {
    expect(completeUtf8Length(data)).toBe(expected);
  });
});

describe('MarkerScanner', () => {
  const prefix = Buffer.from('\x1eNBXabc:', 'latin1');
  function scan(pieces: Buffer[]): { output: string; markers: string[] } {
    let output = '';
    const markers: string[] = [];
    const scanner = new MarkerScanner(prefix, (data) => (output += data.toString('latin1')), (body) => markers.push(`${body}@${output.length}`));
    for (const piece of pieces) scanner.push(piece);
    scanner.flush();
    return { output, markers };
  }

  it('splits output and markers, also when a marker is cut across reads', () => {
    const stream = Buffer.from('one\x1eNBXabc:S\x1etwo\x1eNBXabc:E3\x1ethree', 'latin1');
    for (let cut = 0; cut <= stream.length; cut += 1) {
      expect(scan([stream.subarray(0, cut), stream.subarray(cut)])).toEqual({ output: 'onetwothree', markers: ['S@3', 'E3@6'] });
    }
  });

  it('lets a lone separator byte and look-alikes through', () => {
    expect(scan([Buffer.from('a\x1eb\x1eNBXab', 'latin1')])).toEqual({ output: 'a\x1eb\x1eNBXab', markers: [] });
  });
});

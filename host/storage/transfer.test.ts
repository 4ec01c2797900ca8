// The tar stream between host agents keeps what a disk copy must keep, holes included.
import { afterAll, describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, mkdirSync, symlinkSync, readlinkSync, openSync, ftruncateSync, closeSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { PassThrough } from 'node:stream';
import { packEntries, unpackInto } from './transfer.js';

const dirs: string[] = [];
const temp = () => {
  const d = mkdtempSync(join(tmpdir(), 'nbx-transfer-'));
  dirs.push(d);
  return d;
};
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe('host-to-host tar streams', () => {
  it('carries files, modes, symlinks and a sparse image without filling its holes', async () => {
    const src = temp();
    mkdirSync(join(src, 'layer', 'etc'), { recursive: true });
    writeFileSync(join(src, 'layer', 'etc', 'hello'), 'hi\n', { mode: 0o640 });
    symlinkSync('etc/hello', join(src, 'layer', 'link'));
    const fd = openSync(join(src, 'disk.img'), 'w');
    ftruncateSync(fd, 64 * 2 ** 20);
    writeSync(fd, Buffer.from('end'), 0, 3, 64 * 2 ** 20 - 3);
    closeSync(fd);
    const dst = temp();
    const packed = packEntries(src, ['layer', 'disk.img']);
    const wire = new PassThrough();
    packed.stream.pipe(wire);
    await Promise.all([unpackInto(dst, wire), packed.done]);
    expect(readFileSync(join(dst, 'layer', 'etc', 'hello'), 'utf8')).toBe('hi\n');
    expect(statSync(join(dst, 'layer', 'etc', 'hello')).mode & 0o777).toBe(0o640);
    expect(readlinkSync(join(dst, 'layer', 'link'))).toBe('etc/hello');
    const image = statSync(join(dst, 'disk.img'));
    expect(image.size).toBe(64 * 2 ** 20);
    expect(image.blocks * 512).toBeLessThan(2 ** 20);
  });

  it('fails, and says so, when the stream is cut', async () => {
    const dst = temp();
    const wire = new PassThrough();
    const done = unpackInto(dst, wire);
    wire.write(Buffer.alloc(700, 1));
    wire.destroy(new Error('connection reset'));
    await expect(done).rejects.toThrow();
  });
});

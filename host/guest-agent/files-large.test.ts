// A 256 MiB multipart round trip through the bundled agent running as its own process, with
// its peak RSS measured by the kernel: the upload and the download must both stream.
import busboy from 'busboy';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm } from 'node:fs/promises';
import type { IncomingMessage } from 'node:http';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../agent-protocol/client.js';
import { bodyOf } from './files-testing.js';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const MiB = 1024 * 1024;
// 256 MiB keeps the unit run fast; NESTBOX_LARGE_FILE_MIB=1024 runs the 1 GiB case.
const FILE_MIB = Number(process.env.NESTBOX_LARGE_FILE_MIB ?? 256);

async function peakRssBytes(pid: number): Promise<number> {
  const match = /^VmHWM:\s+(\d+) kB$/m.exec(await readFile(`/proc/${pid}/status`, 'utf8'));
  if (!match) throw new Error(`no VmHWM for ${pid}`);
  return Number(match[1]) * 1024;
}

/** A multipart body streamed from a generator: Daytona's form with one big file. */
function streamingUploadBody(destination: string, sizeMiB: number, hash: ReturnType<typeof createHash>): { body: Readable; contentType: string } {
  const boundary = `----large${randomBytes(8).toString('hex')}`;
  // One random MiB varied per chunk (cheap to produce, still not compressible or repetitive).
  const block = randomBytes(MiB);
  async function* generate(): AsyncGenerator<Buffer> {
    yield Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="files[0].path"\r\n\r\n${destination}\r\n`);
    yield Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="files[0].file"; filename="big.bin"\r\nContent-Type: application/octet-stream\r\n\r\n`);
    for (let index = 0; index < sizeMiB; index++) {
      const chunk = Buffer.from(block);
      chunk.writeUInt32BE(index, 0);
      chunk.writeUInt32BE(Math.imul(index, 2654435761) >>> 0, MiB - 4);
      hash.update(chunk);
      yield chunk;
    }
    yield Buffer.from(`\r\n--${boundary}--\r\n`);
  }
  return { body: Readable.from(generate(), { objectMode: false }), contentType: `multipart/form-data; boundary=${boundary}` };
}

/** Hashes the parts of a streamed multipart answer without collecting them. */
function hashParts(response: IncomingMessage): Promise<{ name: string; filename?: string; digest: string; bytes: number }[]> {
  return new Promise((resolvePromise, reject) => {
    const parts: { name: string; filename?: string; digest: string; bytes: number }[] = [];
    const parser = busboy({ headers: response.headers, preservePath: true });
    parser.on('file', (name, stream, info) => {
      const hash = createHash('sha256');
      let bytes = 0;
      stream.on('data', (chunk: Buffer) => {
        hash.update(chunk);
        bytes += chunk.length;
      });
      stream.on('end', () => parts.push({ name, filename: info.filename, digest: hash.digest('hex'), bytes }));
    });
    parser.on('close', () => resolvePromise(parts));
    parser.on('error', reject);
    pipeline(response, parser).catch(reject);
  });
}

describe('large multipart transfers through the bundled agent', () => {
  let workDir: string;
  let child: ChildProcess;
  let client: AgentClient;
  let home: string;

  beforeAll(async () => {
    workDir = await mkdtemp(join(tmpdir(), 'nestbox-files-large-'));
    const bundlePath = join(workDir, 'guest-agent.mjs');
    execFileSync(process.execPath, [join(repoRoot, 'scripts/bundle-guest-agent.mjs'), '--outfile', bundlePath]);
    home = join(workDir, 'home');
    await mkdir(home);
    const socketPath = join(workDir, 'agent.sock');
    child = spawn(process.execPath, [bundlePath, '--socket', socketPath], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: home },
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    client = new AgentClient(socketPath);
    await client.waitReady({ timeoutMs: 10_000, intervalMs: 50 });
  }, 60_000);
  afterAll(async () => {
    client?.close();
    child?.kill('SIGKILL');
    await rm(workDir, { recursive: true, force: true });
  });

  it(`uploads and downloads ${FILE_MIB} MiB with peak RSS growing far less than that`, async () => {
    // Warm-up: the same routes with a small file, so JIT code and pools are in the baseline.
    const warmHash = createHash('sha256');
    const warm = streamingUploadBody('warm/up.bin', 2, warmHash);
    const warmUp = await client.request({ method: 'POST', path: '/files/upload', headers: { 'content-type': warm.contentType }, body: warm.body });
    expect(warmUp.statusCode).toBe(200);
    await bodyOf(warmUp);
    const warmDown = await client.request({ method: 'POST', path: '/files/download', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ paths: ['warm/up.bin'] }) });
    await hashParts(warmDown);
    const baseline = await peakRssBytes(child.pid!);

    const hash = createHash('sha256');
    const upload = streamingUploadBody('large/big.bin', FILE_MIB, hash);
    const uploaded = await client.request({ method: 'POST', path: '/files/upload', headers: { 'content-type': upload.contentType }, body: upload.body });
    const answer = JSON.parse((await bodyOf(uploaded)).toString('utf8'));
    expect(uploaded.statusCode, JSON.stringify(answer)).toBe(200);
    expect(answer.results).toEqual([{ path: join(home, 'large/big.bin'), size: FILE_MIB * MiB, ok: true }]);
    const expected = hash.digest('hex');

    const onDisk = createHash('sha256');
    for await (const chunk of createReadStream(join(home, 'large/big.bin'))) onDisk.update(chunk as Buffer);
    expect(onDisk.digest('hex')).toBe(expected);
    const afterUpload = await peakRssBytes(child.pid!);

    const downloaded = await client.request({
      method: 'POST',
      path: '/files/download',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ paths: ['large/big.bin', 'large/missing.bin'] }),
    });
    expect(downloaded.statusCode).toBe(200);
    const parts = await hashParts(downloaded);
    expect(parts.map((part) => [part.name, part.filename, part.bytes])).toEqual([
      ['file', 'large/big.bin', FILE_MIB * MiB],
      ['error', 'large/missing.bin', expect.any(Number)],
    ]);
    expect(parts[0].digest).toBe(expected);
    const afterDownload = await peakRssBytes(child.pid!);

    const uploadGrowth = afterUpload - baseline;
    const totalGrowth = afterDownload - baseline;
    // Far below the file size: a buffering implementation would grow by 256 MiB or more.
    expect(uploadGrowth, `upload grew peak RSS by ${(uploadGrowth / MiB).toFixed(1)} MiB`).toBeLessThan(32 * MiB);
    expect(totalGrowth, `upload + download grew peak RSS by ${(totalGrowth / MiB).toFixed(1)} MiB`).toBeLessThan(32 * MiB);
  }, 180_000);
});

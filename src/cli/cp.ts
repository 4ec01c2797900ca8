// `cp`: files and directories between this machine and a sandbox, either way, over the
// per-file routes (each file streamed, never held in memory), with a progress bar on stderr
// for large transfers when stderr is a terminal.
import { createReadStream, createWriteStream } from 'node:fs';
import { lstat, mkdir, readdir, stat } from 'node:fs/promises';
import { basename, join, relative } from 'node:path';
import { posix } from 'node:path';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import type { Command } from 'commander';
import { NativeApiError, type FileInfo, type NativeClient } from '../client/native-client.js';
import type { Config } from '../config.js';
import { clientAction } from './context.js';
import { printJson, CliError } from './output.js';

/** Transfers at least this large get a progress bar (smaller ones finish before it would help). */
const PROGRESS_MIN_BYTES = 4 * 1024 * 1024;

/** `<sandboxId>:<path>`; a local path with a colon in it can be written `./name:…`. */
const REMOTE = /^([A-Za-z0-9][A-Za-z0-9_-]*):(.*)$/;

interface Remote { id: string; path: string }

function remoteOf(arg: string): Remote | undefined {
  if (arg.startsWith('.') || arg.startsWith('/')) return undefined;
  const m = REMOTE.exec(arg);
  return m ? { id: m[1]!, path: m[2] || '.' } : undefined;
}

interface Entry { kind: 'dir' | 'file'; rel: string; size: number; mode: number }

/** Counts bytes as they pass, for the progress bar. */
function counter(onBytes: (n: number) => void): Transform {
  return new Transform({
    transform(chunk: Buffer, _enc, done) {
      onBytes(chunk.length);
      done(null, chunk);
    },
  });
}

async function progress(totalBytes: number): Promise<{ add: (n: number) => void; stop: () => void }> {
  if (!process.stderr.isTTY || totalBytes < PROGRESS_MIN_BYTES) return { add: () => undefined, stop: () => undefined };
  const { default: cliProgress } = await import('cli-progress');
  const bar = new cliProgress.SingleBar({ stream: process.stderr, format: ' {bar} {percentage}% | {value}/{total} MiB | ETA {eta_formatted}', hideCursor: true }, cliProgress.Presets.shades_classic);
  const mib = (n: number) => Math.round((n / 1024 / 1024) * 10) / 10;
  let done = 0;
  bar.start(mib(totalBytes), 0);
  return {
    add: (n) => {
      done += n;
      bar.update(mib(done));
    },
    stop: () => bar.stop(),
  };
}

async function statRemote(client: NativeClient, id: string, path: string): Promise<FileInfo | undefined> {
  try {
    return await client.statFile(id, path);
  } catch (err) {
    if (err instanceof NativeApiError && err.code === 'not_found') return undefined;
    throw err;
  }
}

/** A local directory's entries, parents before children; symlinks and special files are skipped with a note. */
async function walkLocal(root: string): Promise<Entry[]> {
  const out: Entry[] = [];
  const visit = async (dir: string) => {
    for (const dirent of (await readdir(dir, { withFileTypes: true })).sort((a, b) => a.name.localeCompare(b.name))) {
      const full = join(dir, dirent.name);
      const info = await lstat(full);
      if (info.isDirectory()) {
        out.push({ kind: 'dir', rel: relative(root, full), size: 0, mode: info.mode & 0o7777 });
        await visit(full);
      } else if (info.isFile()) {
        out.push({ kind: 'file', rel: relative(root, full), size: info.size, mode: info.mode & 0o7777 });
      } else {
        process.stderr.write(`skipped ${full}: not a regular file or directory\n`);
      }
    }
  };
  await visit(root);
  return out;
}

async function walkRemote(client: NativeClient, id: string, root: string): Promise<Entry[]> {
  const out: Entry[] = [];
  const visit = async (dir: string) => {
    for (const entry of await client.listFiles(id, dir, 1)) {
      const rel = posix.relative(root, entry.path);
      if (entry.type === 'dir') {
        out.push({ kind: 'dir', rel, size: 0, mode: entry.mode & 0o7777 });
        await visit(entry.path);
      } else if (entry.type === 'file') {
        out.push({ kind: 'file', rel, size: entry.size, mode: entry.mode & 0o7777 });
      } else {
        process.stderr.write(`skipped ${entry.path}: not a regular file or directory\n`);
      }
    }
  };
  await visit(root);
  return out;
}

async function upload(client: NativeClient, localPath: string, to: Remote): Promise<{ files: number; bytes: number; destination: string }> {
  const info = await stat(localPath).catch(() => undefined);
  if (!info) throw new CliError(`${localPath}: no such file or directory`);
  if (!info.isFile() && !info.isDirectory()) throw new CliError(`${localPath}: not a regular file or directory`);
  // Into an existing directory, as cp does; else to that name.
  const existing = await statRemote(client, to.id, to.path);
  const destination = existing?.type === 'dir' ? posix.join(to.path, basename(localPath)) : to.path;
  const entries: Entry[] = info.isFile() ? [{ kind: 'file', rel: '', size: info.size, mode: info.mode & 0o7777 }] : await walkLocal(localPath);
  const total = entries.reduce((n, e) => n + e.size, 0);
  const bar = await progress(total);
  try {
    if (info.isDirectory()) await client.makeDirectory(to.id, destination);
    for (const entry of entries) {
      const target = entry.rel ? posix.join(destination, entry.rel.split('\\').join('/')) : destination;
      if (entry.kind === 'dir') {
        await client.makeDirectory(to.id, target);
        continue;
      }
      const source = createReadStream(entry.rel ? join(localPath, entry.rel) : localPath).pipe(counter(bar.add));
      const body = Readable.toWeb(source) as unknown as ReadableStream<Uint8Array>;
      await client.uploadFile(to.id, target, body, entry.mode.toString(8).padStart(3, '0'));
    }
  } finally {
    bar.stop();
  }
  return { files: entries.filter((e) => e.kind === 'file').length, bytes: total, destination: `${to.id}:${destination}` };
}

async function download(client: NativeClient, from: Remote, localPath: string): Promise<{ files: number; bytes: number; destination: string }> {
  const info = await statRemote(client, from.id, from.path);
  if (!info) throw new CliError(`${from.id}:${from.path}: no such file or directory in the sandbox`);
  if (info.type !== 'file' && info.type !== 'dir') throw new CliError(`${from.id}:${from.path}: not a regular file or directory`);
  const local = await stat(localPath).catch(() => undefined);
  const destination = local?.isDirectory() ? join(localPath, posix.basename(info.path)) : localPath;
  const entries: Entry[] = info.type === 'file' ? [{ kind: 'file', rel: '', size: info.size, mode: info.mode & 0o7777 }] : await walkRemote(client, from.id, info.path);
  const total = entries.reduce((n, e) => n + e.size, 0);
  const bar = await progress(total);
  try {
    if (info.type === 'dir') await mkdir(destination, { recursive: true });
    for (const entry of entries) {
      const target = entry.rel ? join(destination, ...entry.rel.split('/')) : destination;
      if (entry.kind === 'dir') {
        await mkdir(target, { recursive: true, mode: entry.mode || 0o755 });
        continue;
      }
      const response = await client.downloadFile(from.id, entry.rel ? posix.join(info.path, entry.rel) : info.path);
      if (!response.body) throw new CliError(`${from.id}:${entry.rel || info.path}: the server sent no body`);
      await pipeline(Readable.fromWeb(response.body as unknown as WebReadableStream<Uint8Array>), counter(bar.add), createWriteStream(target, { mode: entry.mode || 0o644 }));
    }
  } finally {
    bar.stop();
  }
  return { files: entries.filter((e) => e.kind === 'file').length, bytes: total, destination };
}

export function registerCpCommand(program: Command, config: () => Config): void {
  program
    .command('cp')
    .description('copy files or directories between here and a sandbox: cp ./local <id>:/path, or cp <id>:/path ./local')
    .argument('<source>', 'a local path, or <sandboxId>:<path>')
    .argument('<destination>', 'a local path, or <sandboxId>:<path>')
    .action(clientAction(config, async ({ client, json }, source: string, destination: string) => {
      const from = remoteOf(source);
      const to = remoteOf(destination);
      if (from && to) throw new CliError('cp copies between here and a sandbox: one of source and destination must be a local path');
      if (!from && !to) throw new CliError('cp needs one side in a sandbox, written <sandboxId>:<path>');
      const result = to ? await upload(client, source, to) : await download(client, from!, destination);
      if (json) printJson(result);
    }));
}

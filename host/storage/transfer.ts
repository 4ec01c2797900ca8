// Streaming a directory's entries from one host agent to another (host-to-host transfers:
// snapshot layers, a moved sandbox's disk). GNU tar does the archive: it keeps what a disk
// copy must keep (modes, numeric owners, hard links, xattrs such as `trusted.overlay.*`, the
// 0/0 character devices that are overlayfs whiteouts) and `--sparse` sends a sparse disk image's
// holes as holes. Nothing is buffered: tar's stdout is the HTTP answer, the HTTP request is the
// receiving tar's stdin.
import { spawn } from 'node:child_process';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';

const TAR_KEEP = ['--xattrs', '--xattrs-include=*', '--numeric-owner', '--acls'];

/** A tar stream of `entries` (names relative to `dir`); `done` settles once tar has exited. */
export function packEntries(dir: string, entries: string[]): { stream: Readable; done: Promise<void>; kill: () => void } {
  const child = spawn('tar', ['--create', '--sparse', ...TAR_KEEP, '--directory', dir, '--file', '-', '--', ...entries], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr = (stderr + String(d)).slice(-4000)));
  const done = new Promise<void>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code, signal) => (code === 0 ? resolve() : reject(new Error(`tar --create in ${dir} failed (${signal ?? code}): ${stderr.trim()}`))));
  });
  done.catch(() => {});
  return { stream: child.stdout, done, kill: () => child.kill('SIGKILL') };
}

/** Unpacks a tar stream into `dir` (which must exist); rejects if the stream or tar fails. */
export async function unpackInto(dir: string, source: Readable): Promise<void> {
  const child = spawn('tar', ['--extract', ...TAR_KEEP, '--same-owner', '--same-permissions', '--directory', dir, '--file', '-'], { stdio: ['pipe', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr = (stderr + String(d)).slice(-4000)));
  const exited = new Promise<void>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code, signal) => (code === 0 ? resolve() : reject(new Error(`tar --extract into ${dir} failed (${signal ?? code}): ${stderr.trim()}`))));
  });
  exited.catch(() => {});
  try {
    await pipeline(source, child.stdin);
  } catch (error) {
    child.kill('SIGKILL');
    await exited.catch(() => {});
    throw error;
  }
  await exited;
}

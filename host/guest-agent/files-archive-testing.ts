// Test support (never imported by the agent): tar archives written header by header with
// node-tar's Header, so tests can build exactly the hostile entries a real tar would refuse to
// make (`../x`, absolute names, a symlink and then a file through it, links outside).
import { Header } from 'tar';
import { gzipSync } from 'node:zlib';

export interface RawEntry {
  path: string;
  type?: 'File' | 'Directory' | 'SymbolicLink' | 'Link' | 'CharacterDevice' | 'BlockDevice' | 'FIFO';
  content?: string | Buffer;
  linkpath?: string;
  mode?: number;
  uid?: number;
  gid?: number;
  mtime?: Date;
  devmaj?: number;
  devmin?: number;
}

const BLOCK = 512;

export function rawTar(entries: RawEntry[], options: { gzip?: boolean } = {}): Buffer {
  const blocks: Buffer[] = [];
  for (const entry of entries) {
    const type = entry.type ?? 'File';
    const content = type === 'File' ? Buffer.from(entry.content ?? '') : Buffer.alloc(0);
    const header = new Header({
      path: entry.path,
      type,
      size: content.length,
      linkpath: entry.linkpath,
      mode: entry.mode ?? (type === 'Directory' ? 0o755 : 0o644),
      uid: entry.uid ?? 0,
      gid: entry.gid ?? 0,
      mtime: entry.mtime ?? new Date('2024-01-02T03:04:05Z'),
      devmaj: entry.devmaj ?? 0,
      devmin: entry.devmin ?? 0,
    });
    const block = Buffer.alloc(BLOCK);
    header.encode(block, 0);
    blocks.push(block);
    if (content.length) {
      blocks.push(content);
      const pad = (BLOCK - (content.length % BLOCK)) % BLOCK;
      if (pad) blocks.push(Buffer.alloc(pad));
    }
  }
  blocks.push(Buffer.alloc(BLOCK * 2));
  const tar = Buffer.concat(blocks);
  return options.gzip ? gzipSync(tar) : tar;
}

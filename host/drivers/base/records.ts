// The per-sandbox record file both drivers keep (`<dataDir>/sandboxes/<id>/record.json`):
// everything a later host agent needs to adopt a running sandbox or clean up after a crash.
// Written atomically (temp file + rename) so a kill -9 leaves either the old or the new record,
// never half of one. Each driver defines its record's shape and which versions it accepts.
import { readFile, readdir, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { writeFileAtomic } from '../../util/fs.js';

export const RECORD_FILE = 'record.json';

export async function writeRecordFile(sandboxDir: string, record: { updatedAt: string }): Promise<void> {
  record.updatedAt = new Date().toISOString();
  await writeFileAtomic(join(sandboxDir, RECORD_FILE), `${JSON.stringify(record, null, 2)}\n`, 0o600);
}

/** The record, when there is one that parses and that `accept` recognises (its driver, its version). */
export async function readRecordFile<T>(sandboxDir: string, accept: (record: T) => boolean): Promise<T | undefined> {
  try {
    const record = JSON.parse(await readFile(join(sandboxDir, RECORD_FILE), 'utf8')) as T;
    return accept(record) ? record : undefined;
  } catch {
    return undefined;
  }
}

/** Temp files of record writes interrupted by a crash. */
export async function removeRecordTempFiles(sandboxDir: string): Promise<void> {
  const entries = await readdir(sandboxDir).catch(() => [] as string[]);
  for (const entry of entries) if (entry.startsWith(`${RECORD_FILE}.tmp-`)) await rm(join(sandboxDir, entry), { force: true });
}

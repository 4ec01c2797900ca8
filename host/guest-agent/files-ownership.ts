// `owner=<uid>:<gid>` on a write (PUT /files/content, POST /files/upload, POST /files/mkdir): the
// account a front door writes for (E2B's `user`, Daytona's `daytona`). The agent writes as root;
// what the request creates — the file and every directory made for it — is then given to that
// account, as the vendors' daemons, which run as the user, would have made them.
import { chown } from 'node:fs/promises';
import { posix } from 'node:path';
import { validationFailed } from './errors.js';

export interface Owner {
  uid: number;
  gid: number;
}

export function parseOwner(raw: string | null | undefined): Owner | undefined {
  if (raw === null || raw === undefined || raw === '') return undefined;
  const match = /^(\d{1,10}):(\d{1,10})$/.exec(raw);
  if (!match || Number(match[1]) > 0xfffffffe || Number(match[2]) > 0xfffffffe) throw validationFailed('owner', 'expected <uid>:<gid>, numeric');
  return { uid: Number(match[1]), gid: Number(match[2]) };
}

/** Gives `firstCreated` (what `mkdir -p` reported) and each directory below it down to `leaf`. */
export async function giveCreatedDirectories(firstCreated: string | undefined, leaf: string, owner: Owner | undefined): Promise<void> {
  if (!owner || firstCreated === undefined) return;
  const relative = posix.relative(firstCreated, leaf);
  if (relative.startsWith('..')) return;
  let current = firstCreated;
  await chown(current, owner.uid, owner.gid);
  for (const part of relative ? relative.split('/') : []) {
    current = posix.join(current, part);
    await chown(current, owner.uid, owner.gid);
  }
}

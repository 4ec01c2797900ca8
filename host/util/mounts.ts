// What is mounted where in this mount namespace, read from /proc/self/mountinfo: the one parser
// behind tree removal, the reflink store's and the sandbox disks' "already mounted?" checks.
import { readFileSync } from 'node:fs';

export interface MountEntry {
  mountPoint: string;
  fsType: string | undefined;
  /** What is mounted (a device such as /dev/loop3, or the file system's own name). */
  source: string | undefined;
}

/** Every mount in order (later mounts on a path hide earlier ones); none when unreadable. */
export function readMountinfo(): MountEntry[] {
  let text = '';
  try {
    text = readFileSync('/proc/self/mountinfo', 'utf8');
  } catch {
    return [];
  }
  return text.split('\n').map((line) => {
    const fields = line.split(' ');
    const separator = fields.indexOf('-');
    return { mountPoint: decodeMountinfoPath(fields[4] ?? ''), fsType: separator > 0 ? fields[separator + 1] : undefined, source: separator > 0 ? fields[separator + 2] : undefined };
  });
}

function decodeMountinfoPath(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8)));
}

/** Mount points at or below `path`, sorted (parents before children). */
export function mountPointsUnder(path: string): string[] {
  const prefix = path.endsWith('/') ? path : `${path}/`;
  return readMountinfo()
    .map((entry) => entry.mountPoint)
    .filter((mountPoint) => mountPoint === path || mountPoint.startsWith(prefix))
    .sort();
}

/** The filesystem type mounted exactly at `path` in this mount namespace, if any. */
export function mountedFsType(path: string): string | undefined {
  let found: string | undefined;
  // The last mount on a path is the visible one.
  for (const entry of readMountinfo()) if (entry.mountPoint === path && entry.fsType !== undefined) found = entry.fsType;
  return found;
}

export function isMountPoint(path: string): boolean {
  return readMountinfo().some((entry) => entry.mountPoint === path);
}

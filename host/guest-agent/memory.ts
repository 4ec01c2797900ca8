// Keeps the agent's memory flat while it streams large bodies.
//
// Every streamed chunk lives in its own off-heap buffer (Node's HTTP parser copies each body
// chunk; file read streams allocate one per read). The chunks die young, but V8 only scavenges
// when its young generation fills with JS objects, which the tiny Buffer wrappers rarely do, so
// some 40 MiB of dead chunks pile up before anything is freed. Measured on a 50 MiB upload: RSS
// +37 MiB without a nudge, +10 MiB with a minor GC every 4 MiB. A sandbox may have little
// memory, and a scavenge of an almost empty young generation costs well under a millisecond.
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

type MinorGc = (options: { type: 'minor' }) => void;

let cachedGc: MinorGc | null | undefined;

function minorGc(): MinorGc | null {
  if (cachedGc !== undefined) return cachedGc;
  try {
    // Exposes gc() to new contexts only, so neither the agent's global nor any user code sees it.
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as unknown;
    cachedGc = typeof gc === 'function' ? (gc as MinorGc) : null;
  } catch {
    cachedGc = null;
  }
  return cachedGc;
}

/** Returns a counter that runs a minor GC each time another `everyBytes` have been streamed. */
export function createScavengeNudge(everyBytes: number): (bytes: number) => void {
  let sinceLast = 0;
  return (bytes) => {
    sinceLast += bytes;
    if (sinceLast < everyBytes) return;
    sinceLast = 0;
    minorGc()?.({ type: 'minor' });
  };
}

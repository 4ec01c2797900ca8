// NESTBOX_DAYTONA_DEFAULT_SNAPSHOT through the real @daytonaio/sdk 0.218: what `daytona.create()`
// without a snapshot starts from. Daytona's default snapshot has the Python data stack; an operator
// can point Nestbox's at one that does (the built-in `code-interpreter` image, say). Here the
// setting names a snapshot the test makes, so the test needs no particular image.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DaytonaError } from '@daytonaio/sdk';
import { startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

const DEFAULT_SNAPSHOT = 'operator-default';
let env: DaytonaTestEnv;

beforeAll(async () => {
  env = await startDaytonaEnv({ NESTBOX_DAYTONA_DEFAULT_SNAPSHOT: DEFAULT_SNAPSHOT });
});

afterAll(async () => {
  await env?.daytona.snapshot.get(DEFAULT_SNAPSHOT).then((s) => env.daytona.snapshot.delete(s)).catch(() => undefined);
  await env?.server.close();
});

describe('the default snapshot of a create without one', () => {
  it('is the configured snapshot; an explicit snapshot still wins; a missing one is a 400 naming it', async () => {
    // Not made yet: the create says which snapshot it looked for rather than starting elsewhere.
    const missing = await env.daytona.create({ networkBlockAll: true }, { timeout: 0 }).catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(DaytonaError);
    expect((missing as DaytonaError).statusCode).toBe(400);
    expect((missing as Error).message).toContain(`"${DEFAULT_SNAPSHOT}"`);

    const source = await env.daytona.create({ snapshot: 'default', networkBlockAll: true }, { timeout: 0 });
    try {
      await source.process.executeCommand('echo from-operator-default > /home/daytona/marker.txt');
      await source.createSnapshot(DEFAULT_SNAPSHOT);
    } finally {
      await source.delete();
    }
    const implicit = await env.daytona.create({ language: 'python', networkBlockAll: true }, { timeout: 0 });
    const explicit = await env.daytona.create({ snapshot: 'default', networkBlockAll: true }, { timeout: 0 });
    try {
      expect((await implicit.process.executeCommand('cat /home/daytona/marker.txt')).result.trim()).toBe('from-operator-default');
      expect((await explicit.process.executeCommand('test -e /home/daytona/marker.txt; echo $?')).result.trim()).toBe('1');
    } finally {
      await implicit.delete();
      await explicit.delete();
    }
  });
});

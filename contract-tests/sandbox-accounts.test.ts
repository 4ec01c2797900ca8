// The account choice of the compat layers over a sandbox's /etc/passwd: the vendor's default,
// root when an image (one the user brought) has no such user, a 400 for a named user it lacks,
// and paths in the chosen home. The passwd text stands in for the sandbox's file; the contract
// tests (contract-tests/*/users.test.ts) run the same code against real sandboxes.
import { Readable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { NestboxError } from '../core/errors.js';
import type { Principal } from '../core/types.js';
import { inHome, ROOT_ACCOUNT, SandboxAccounts } from '../compat/sandbox-accounts.js';

const DEFAULT_IMAGE = 'root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\ndaytona:x:1001:1001:daytona:/home/daytona:/bin/bash\n';
const BUSYBOX = 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n';
const principal = {} as Principal;

function accountsOver(files: Record<string, string | Error>, now = () => 0): { accounts: SandboxAccounts; reads: () => number } {
  let reads = 0;
  const toolbox = {
    async readFile(_p: Principal, sandboxId: string) {
      reads++;
      const content = files[sandboxId];
      if (content instanceof Error) throw content;
      return { status: 200, headers: {}, body: Readable.from([Buffer.from(content)]) };
    },
  };
  return { accounts: new SandboxAccounts(toolbox, now), reads: () => reads };
}

describe('SandboxAccounts', () => {
  it("uses the vendor's user where the image has it, root where it does not", async () => {
    const { accounts } = accountsOver({ def: DEFAULT_IMAGE, oci: BUSYBOX, distroless: new NestboxError('not_found', 'no such file') });
    expect(await accounts.resolve(principal, 'def', undefined, 'user')).toEqual({ name: 'user', uid: 1000, gid: 1000, home: '/home/user' });
    expect(await accounts.resolve(principal, 'def', undefined, 'daytona')).toMatchObject({ name: 'daytona', home: '/home/daytona' });
    expect(await accounts.resolve(principal, 'oci', undefined, 'user')).toMatchObject({ name: 'root', uid: 0, home: '/root' });
    expect(await accounts.resolve(principal, 'distroless', undefined, 'user')).toEqual(ROOT_ACCOUNT);
  });

  it('gives a named user, refuses one the sandbox lacks, and knows root without reading', async () => {
    const { accounts, reads } = accountsOver({ oci: BUSYBOX });
    expect(await accounts.resolve(principal, 'oci', 'nobody', 'user')).toMatchObject({ name: 'nobody', uid: 65534, home: '/home' });
    await expect(accounts.resolve(principal, 'oci', 'user', 'user')).rejects.toMatchObject({ code: 'validation_failed', message: expect.stringMatching(/^user: no such user/) });
    const before = reads();
    expect(await accounts.resolve(principal, 'oci', 'root', 'user')).toEqual(ROOT_ACCOUNT);
    expect(reads()).toBe(before);
  });

  it('rereads a passwd that lacks the name (useradd in the sandbox) and reuses a fresh one', async () => {
    const files: Record<string, string> = { s: BUSYBOX };
    let clock = 0;
    const { accounts, reads } = accountsOver(files, () => clock);
    await accounts.resolve(principal, 's', 'nobody', 'user');
    await accounts.resolve(principal, 's', 'nobody', 'user');
    expect(reads()).toBe(1);
    files.s = `${BUSYBOX}dev:x:1002:1002::/home/dev:/bin/sh\n`;
    expect(await accounts.resolve(principal, 's', 'dev', 'user')).toMatchObject({ uid: 1002, home: '/home/dev' });
    clock = 60_000;
    await accounts.resolve(principal, 's', 'nobody', 'user');
    expect(reads()).toBe(3);
  });

  it('falls back to the conventional home when the key may not read files', async () => {
    const { accounts } = accountsOver({ s: new NestboxError('forbidden', 'needs files:read') });
    expect(await accounts.resolve(principal, 's', undefined, 'daytona')).toEqual({ name: 'daytona', home: '/home/daytona' });
  });

  it('resolves ~, ~/x and relative paths in the home; absolute ones stay', () => {
    expect(inHome('~', '/home/user')).toBe('/home/user');
    expect(inHome('~/a/b', '/home/user')).toBe('/home/user/a/b');
    expect(inHome('a.txt', '/home/user')).toBe('/home/user/a.txt');
    expect(inHome('../x', '/home/user')).toBe('/home/x');
    expect(inHome('/etc/hosts', '/home/user')).toBe('/etc/hosts');
  });
});

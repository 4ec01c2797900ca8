// Where Daytona's daemon starts what it runs: the WORKDIR of the sandbox's image (Image.workdir,
// a Dockerfile's WORKDIR), else the home of the account it acts as. Shared by the toolbox routes
// and its WebSockets, so commands, code runs and interpreter contexts start in the same place.
import type { CompatPort } from '../../core/compat-port.js';
import type { Principal } from '../../core/types.js';

export interface Workdirs {
  /** The image's WORKDIR, or undefined when it has none (the account's home is the default). */
  of(principal: Principal, sandboxId: string): Promise<string | undefined>;
}

/** Cached per sandbox: a sandbox's image never changes. Bounded: cleared past 10 000 sandboxes. */
export function createWorkdirs(core: Pick<CompatPort, 'images' | 'sandboxes'>): Workdirs {
  const workdirs = new Map<string, string | null>();
  return {
    async of(principal, sandboxId) {
      if (!workdirs.has(sandboxId)) {
        const image = await core.images.ofSandbox(await core.sandboxes.get(principal, sandboxId));
        if (workdirs.size >= 10_000) workdirs.clear();
        workdirs.set(sandboxId, image?.config.workdir || null);
      }
      return workdirs.get(sandboxId) ?? undefined;
    },
  };
}

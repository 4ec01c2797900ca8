// The default user and working directory of a sandbox started from a template: E2B persists a
// template's last `setUser` / `setWorkdir` "as a default to the sandbox execution" (its docs,
// "User and workdir"), so envd's commands run as that user, in that directory, unless the SDK
// names others. A template is an image (templates.ts): its config holds both. Sandboxes of the
// built-in image (and of images that set neither) keep E2B's `user` and its home.
//
// A sandbox's image never changes, so the answer is kept per sandbox (bounded).
import type { CompatPort } from '../../core/compat-port.js';
import type { SandboxTarget } from './target.js';

export interface TemplateDefaults {
  /** The account commands run as when the request names none. */
  user?: string;
  /** The directory commands start in when the request names none. */
  workdir?: string;
}

const CACHE_MAX = 2_000;
const cache = new Map<string, TemplateDefaults>();

export type TemplateDefaultsPort = Pick<CompatPort, 'sandboxes' | 'images'>;

export async function templateDefaults(core: TemplateDefaultsPort, target: SandboxTarget): Promise<TemplateDefaults> {
  const known = cache.get(target.sandboxId);
  if (known) return known;
  let defaults: TemplateDefaults = {};
  try {
    const sandbox = await core.sandboxes.get(target.principal, target.sandboxId);
    const image = sandbox.imageId ? await core.images.ofSandbox(sandbox) : undefined;
    if (image) {
      // `user[:group]` (a Dockerfile's USER): the account is the user part.
      const user = image.config.user.split(':')[0];
      defaults = { ...(user ? { user } : {}), ...(image.config.workdir ? { workdir: image.config.workdir } : {}) };
    }
  } catch {
    // A key that may not read the sandbox (or a sandbox gone): E2B's defaults, not remembered.
    return {};
  }
  cache.set(target.sandboxId, defaults);
  while (cache.size > CACHE_MAX) cache.delete(cache.keys().next().value!);
  return defaults;
}

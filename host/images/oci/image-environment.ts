// What an OCI image's config says processes start with, shared by both drivers (the local
// driver hands it to the agent it launches; the Cloud Hypervisor driver bakes it into the
// image's disk, host/images/vm-image-oci.ts).
import type { OciImageConfig } from './store.js';

/** Names a process environment can carry (the same rule as the sandbox spec's env). */
export const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * An OCI config's Env (`NAME=value` lines) and WorkingDir as the agent's environment. The agent's
 * HOME is also every process's default cwd, so it must exist: the image's HOME, else its
 * WorkingDir, else /root when the image has one (as Docker's HOME), else / (Docker's cwd).
 */
export function imageEnvironment(config: Pick<OciImageConfig, 'env' | 'workingDir'>, hasRootHome: boolean, warn: (message: string) => void): Record<string, string> {
  const env: Record<string, string> = {};
  for (const line of config.env) {
    const at = line.indexOf('=');
    const name = at > 0 ? line.slice(0, at) : '';
    const value = at > 0 ? line.slice(at + 1) : '';
    if (ENV_NAME.test(name) && !value.includes('\0')) env[name] = value;
    else warn(`image environment entry ${JSON.stringify(line.slice(0, 80))} is not NAME=value with a valid name; ignored`);
  }
  if (env.HOME === undefined) env.HOME = config.workingDir.startsWith('/') ? config.workingDir : hasRootHome ? '/root' : '/';
  return env;
}

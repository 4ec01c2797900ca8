// Which server the CLI's client commands talk to, and with which key. One resolver for every
// client command (and `nestbox build`): flags > NESTBOX_URL / NESTBOX_API_KEY > the profile
// written by `nestbox login` > this machine's server and its bootstrap key.
import { existsSync, readFileSync } from 'node:fs';
import { chmod, mkdir, rename, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { ConfigError, type Config } from '../config.js';
import { NativeClient } from '../client/native-client.js';

export interface ConnectionFlags {
  url?: string;
  apiKey?: string;
  profile?: string;
}

export interface Profile { url: string; apiKey: string }

interface ProfileFile { profiles: Record<string, Profile> }

export function readProfiles(file: string): ProfileFile {
  if (!existsSync(file)) return { profiles: {} };
  let parsed: unknown;
  try {
    parsed = JSON.parse(readFileSync(file, 'utf8'));
  } catch (err) {
    throw new ConfigError(`${file}: not a profile file (${(err as Error).message})`);
  }
  const profiles = (parsed as Partial<ProfileFile> | null)?.profiles;
  if (!profiles || typeof profiles !== 'object') throw new ConfigError(`${file}: not a profile file (no "profiles" object)`);
  return { profiles };
}

/** Saves one profile, the file private to its owner (it holds API keys) and replaced atomically. */
export async function writeProfile(file: string, name: string, profile: Profile): Promise<void> {
  const current = readProfiles(file);
  current.profiles[name] = profile;
  await mkdir(dirname(file), { recursive: true, mode: 0o700 });
  const tmp = `${file}.${process.pid}.tmp`;
  await writeFile(tmp, `${JSON.stringify(current, null, 2)}\n`, { mode: 0o600 });
  // mode on writeFile is masked by the umask and ignored for an existing file: set it outright.
  await chmod(tmp, 0o600);
  await rename(tmp, file);
}

export function profileName(config: Config, flags: ConnectionFlags): string {
  return flags.profile ?? config.client.profile;
}

/** The server URL and key, by the precedence above; each of the two is resolved on its own. */
export function resolveConnection(config: Config, flags: ConnectionFlags): Profile {
  const name = profileName(config, flags);
  const profiles = readProfiles(config.client.profileFile).profiles;
  const profile = profiles[name];
  // A profile asked for by name that does not exist is a mistake, not a reason to fall back.
  if (flags.profile && !profile) throw new ConfigError(`no profile "${flags.profile}" in ${config.client.profileFile} (run nestbox login --profile ${flags.profile})`);
  const url = (flags.url ?? config.client.url ?? profile?.url ?? `http://127.0.0.1:${config.port}`).replace(/\/+$/, '');
  const keyFile = join(config.dataDir, 'bootstrap-api-key');
  const apiKey = flags.apiKey ?? config.client.apiKey ?? profile?.apiKey ?? (existsSync(keyFile) ? readFileSync(keyFile, 'utf8').trim() : undefined);
  if (!apiKey) throw new ConfigError(`no API key: pass --api-key, set NESTBOX_API_KEY, run nestbox login, or run this on the server's machine (where ${keyFile} holds the bootstrap key)`);
  return { url, apiKey };
}

export function clientFor(config: Config, flags: ConnectionFlags): NativeClient {
  return new NativeClient(resolveConnection(config, flags));
}

// skopeo's configuration, rendered from Nestbox's: registries.conf (containers-registries.conf(5),
// version 2) with the mirrors of the registry being pulled from and which endpoints may be
// reached over plain HTTP, and a policy that accepts images without signatures (Nestbox does
// not verify signatures yet; the host's /etc/containers/policy.json is not consulted).
import { isLoopbackRegistry } from './reference.js';

export interface RegistryConfig {
  /** Registry → mirror locations tried in order before it (`docker.io` → [`mirror.example.com/hub`]). */
  mirrors?: Record<string, string[]>;
  /** Registries (host[:port]) that may be plain HTTP or unverified TLS besides loopback ones. */
  insecureRegistries?: string[];
}

/** host[:port] of a mirror location that may carry a path. */
export function locationHost(location: string): string {
  return location.split('/')[0];
}

export function endpointIsInsecure(location: string, config: RegistryConfig): boolean {
  const host = locationHost(location);
  return isLoopbackRegistry(host) || (config.insecureRegistries ?? []).includes(host);
}

function tomlString(value: string): string {
  return JSON.stringify(value);
}

export function renderRegistriesConf(registry: string, config: RegistryConfig): string {
  const lines = [
    '# Written by Nestbox (host/images/oci/registries.ts) for one pull; edits are overwritten.',
    '# Short names are never searched: references are normalised before skopeo sees them.',
    'unqualified-search-registries = []',
    '',
    '[[registry]]',
    `prefix = ${tomlString(registry)}`,
    `location = ${tomlString(registry)}`,
    `insecure = ${endpointIsInsecure(registry, config)}`,
  ];
  for (const mirror of config.mirrors?.[registry] ?? []) {
    lines.push('', '[[registry.mirror]]', `location = ${tomlString(mirror)}`, `insecure = ${endpointIsInsecure(mirror, config)}`);
  }
  return `${lines.join('\n')}\n`;
}

export function renderPolicy(): string {
  return `${JSON.stringify({ default: [{ type: 'insecureAcceptAnything' }] }, null, 2)}\n`;
}

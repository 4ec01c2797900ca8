// Image references as Docker writes them (`busybox`, `ghcr.io/org/app:1.2`, `127.0.0.1:5000/x@sha256:…`),
// normalised the way Docker does: no registry means Docker Hub, a one-part Docker Hub name is in
// `library/`, no tag and no digest means `:latest`. skopeo receives the normalised form, so what
// is pulled, what a mirror rule matches and what the store records are the same string.
import { ImageError } from './errors.js';

export interface ImageReference {
  /** Host and optional port (`docker.io`, `127.0.0.1:5000`). */
  registry: string;
  /** Path inside the registry (`library/busybox`). */
  repository: string;
  tag?: string;
  /** `sha256:<64 hex>` when the reference pins one. */
  digest?: string;
}

export const DOCKER_HUB = 'docker.io';
const COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const TAG = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
export const DIGEST = /^sha256:[a-f0-9]{64}$/;
// A first path part is a registry when it has a dot or a port, or is localhost (Docker's rule).
const REGISTRY = /^(?:localhost|\[[0-9a-fA-F:]+\]|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::\d{1,5})?$/;

export function parseImageReference(text: string): ImageReference {
  const invalid = (why: string) => new ImageError('validation_failed', `image reference "${text}": ${why}`);
  if (typeof text !== 'string' || text.length === 0 || text.length > 512) throw invalid('must be 1 to 512 characters');
  let rest = text;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST.test(digest)) throw invalid('a digest must be sha256: followed by 64 lowercase hex digits');
  }
  let tag: string | undefined;
  const lastSlash = rest.lastIndexOf('/');
  const colon = rest.lastIndexOf(':');
  if (colon > lastSlash) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!TAG.test(tag)) throw invalid(`invalid tag "${tag}"`);
  }
  const parts = rest.split('/');
  let registry = DOCKER_HUB;
  if (parts.length > 1 && (parts[0].includes('.') || parts[0].includes(':') || parts[0] === 'localhost')) {
    registry = parts.shift()!;
    if (!REGISTRY.test(registry)) throw invalid(`invalid registry "${registry}"`);
  }
  if (registry === 'index.docker.io' || registry === 'registry-1.docker.io') registry = DOCKER_HUB;
  if (registry === DOCKER_HUB && parts.length === 1) parts.unshift('library');
  for (const part of parts) if (!COMPONENT.test(part)) throw invalid(`invalid repository component "${part}" (lowercase letters, digits and . _ - separators)`);
  if (!tag && !digest) tag = 'latest';
  return { registry, repository: parts.join('/'), tag, digest };
}

/** `registry/repository[:tag][@digest]`, the normalised text. */
export function formatImageReference(ref: ImageReference): string {
  return `${ref.registry}/${ref.repository}${ref.tag ? `:${ref.tag}` : ''}${ref.digest ? `@${ref.digest}` : ''}`;
}

/** Loopback registries may speak plain HTTP, as Docker allows (and only they, unless configured). */
export function isLoopbackRegistry(registry: string): boolean {
  const host = registry.replace(/:\d+$/, '').replace(/^\[|\]$/g, '');
  return host === 'localhost' || host === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

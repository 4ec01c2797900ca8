import type { Db, DbOrTx } from '../store/db.js';
import { buildCacheRepository, imageRepository } from '../store/repositories/images.js';
import { snapshotRepository } from '../store/repositories/snapshots.js';
import { sandboxRepository } from '../store/repositories/sandboxes.js';
import { errors, NestboxError, toNestboxError } from '../errors.js';
import { randomId } from '../ids.js';
import type { Logger } from '../logger.js';
import type { Principal, Sandbox } from '../types.js';
import { emptyImageConfig, type Image, type ImageConfig, type ImageSource } from '../images/types.js';
import { checkWithinLimits, NO_ORGANIZATION_LIMITS, type OrganizationLimits } from './org-limits.js';
import { requireScope } from './auth.js';
import type { HostService } from './hosts.js';

/** Repository names: Docker's lower-case rule is relaxed to Daytona's and E2B's names (mixed case, `/` namespaces). */
export const IMAGE_NAME = /^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$/;
export const IMAGE_TAG = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/;
export const DEFAULT_TAG = 'latest';
/** The PATH of Debian's login environment (the built-in image's). */
const DEBIAN_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** The built-in image's name: every organisation has it, on every host. */
export const BUILTIN_IMAGE = 'default';
/** The built-in image with Jupyter kernels and the data stack (host/images/code-interpreter-image.ts): on every host too. */
export const CODE_INTERPRETER_IMAGE = 'code-interpreter';
/** Every built-in image, in the order lists show them: not rows, not deletable, not taggable. */
export const BUILTIN_IMAGES = [BUILTIN_IMAGE, CODE_INTERPRETER_IMAGE] as const;
export type BuiltinImageName = (typeof BUILTIN_IMAGES)[number];

/** The built-in image `reference` names (`name` or `name:latest`), if it names one. */
export function builtinImageNamed(reference: string): BuiltinImageName | undefined {
  return BUILTIN_IMAGES.find((name) => reference === name || reference === `${name}:${DEFAULT_TAG}`);
}

export interface ImageReference {
  name: string;
  tag: string;
}

/** `name[:tag]` (tag default `latest`); a field-named 400 otherwise. */
export function parseImageName(reference: string, field = 'image', defaultTag = DEFAULT_TAG): ImageReference {
  if (typeof reference !== 'string' || !reference) throw errors.validation(field, 'must be an image name, `name` or `name:tag`');
  const colon = reference.lastIndexOf(':');
  const name = colon > 0 && !reference.slice(colon).includes('/') ? reference.slice(0, colon) : reference;
  const tag = colon > 0 && !reference.slice(colon).includes('/') ? reference.slice(colon + 1) : defaultTag;
  if (!IMAGE_NAME.test(name)) throw errors.validation(field, `"${reference.slice(0, 200)}": a name is 1-128 letters, digits, ".", "_", "-" or "/", starting with a letter or digit`);
  if (!IMAGE_TAG.test(tag)) throw errors.validation(field, `"${reference.slice(0, 200)}": a tag is 1-128 letters, digits, ".", "_" or "-"`);
  return { name, tag };
}

/**
 * Images: named, tagged, digest-addressed trees sandboxes start from (issue 14). A ready image
 * never changes; a build or pull of `name:tag` moves the tag to a new image. An image nothing
 * points at (no tag, no sandbox) is removed by `collectGarbage`, with the build layers only it
 * needed. The built-in images (`default`, `code-interpreter`) are not rows: every organisation
 * sees them, on every host.
 */
export class ImageService {
  constructor(
    private readonly db: Db,
    private readonly hosts: HostService,
    private readonly logger: Logger,
    /** The server's default organisation limits (images are counted against `maxImages`). */
    private readonly orgLimits: OrganizationLimits = NO_ORGANIZATION_LIMITS,
  ) {}

  /**
   * Refuse (429 quota_exceeded) when one more image would go over the organisation's limit.
   * Building `name:tag` that already names an image replaces it (the old one goes once nothing
   * uses it), so it asks for none. Inside `tx` with the organisation's row locked.
   */
  async checkImageLimit(tx: DbOrTx, organizationId: string, name: string, tag: string): Promise<void> {
    const replaces = await imageRepository(tx).findByTag(organizationId, name, tag);
    await checkWithinLimits(tx, organizationId, { images: replaces ? 0 : 1 }, this.orgLimits);
  }

  builtin(organizationId: string, name: BuiltinImageName = BUILTIN_IMAGE): Image {
    return {
      id: name,
      organizationId,
      name,
      tags: [DEFAULT_TAG],
      state: 'ready',
      hostId: null,
      // The host builds it from its name (host/images): the same name on every host.
      base: name,
      snapshotId: null,
      // Debian's PATH, as the image's own processes get it, so `ENV PATH=$PATH:/x` in a build
      // FROM default extends it instead of replacing it.
      config: { ...emptyImageConfig(), env: [['PATH', DEBIAN_PATH]], labels: { 'org.nestbox.builtin': 'true' } },
      source: { kind: 'builtin' },
      buildId: null,
      sizeBytes: null,
      createdAt: new Date(0),
    };
  }

  /** The organisation's image by `name[:tag]`, image id, or a built-in image's name; undefined when there is none. */
  async find(organizationId: string, reference: string, field = 'image'): Promise<Image | undefined> {
    const builtin = builtinImageNamed(reference);
    if (builtin) return this.builtin(organizationId, builtin);
    if (/^img[a-z0-9]{17}$/.test(reference)) return imageRepository(this.db).findById(organizationId, reference);
    const { name, tag } = parseImageName(reference, field);
    return imageRepository(this.db).findByTag(organizationId, name, tag);
  }

  async get(principal: Principal, reference: string): Promise<Image> {
    requireScope(principal, 'images:read');
    const image = await this.find(principal.organizationId, reference);
    if (!image) throw errors.notFound('image', reference);
    return image;
  }

  async list(principal: Principal, input: { name?: string; includeUntagged?: boolean; limit?: number; cursor?: string }): Promise<{ items: Image[]; nextCursor: string | null }> {
    requireScope(principal, 'images:read');
    const limit = input.limit ?? 50;
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw errors.validation('limit', 'must be an integer from 1 to 1000');
    if (input.name !== undefined && !IMAGE_NAME.test(input.name)) throw errors.validation('name', 'is not an image name');
    const before = input.cursor ? decodeCursor(input.cursor) : undefined;
    const rows = await imageRepository(this.db).list(principal.organizationId, { name: input.name, includeUntagged: input.includeUntagged, limit: limit + 1, before });
    // The built-in images head the first page of an unfiltered list.
    const builtins = before ? [] : BUILTIN_IMAGES.filter((name) => input.name === undefined || input.name === name).map((name) => this.builtin(principal.organizationId, name));
    const withBuiltin = [...builtins, ...rows];
    const page = withBuiltin.slice(0, limit);
    const last = page[page.length - 1];
    return { items: page, nextCursor: withBuiltin.length > limit && last ? encodeCursor(last) : null };
  }

  /** Tags of one name (E2B's `getTags`), oldest first. */
  async tagsOf(principal: Principal, name: string): Promise<{ tag: string; imageId: string; buildId: string | null; createdAt: Date }[]> {
    requireScope(principal, 'images:read');
    if (!IMAGE_NAME.test(name)) throw errors.validation('name', 'is not an image name');
    return imageRepository(this.db).tagsOfName(principal.organizationId, name);
  }

  /** Points more tags of `name` at the image `target` names (E2B's `assignTags`). */
  async addTags(principal: Principal, target: string, name: string, tags: string[]): Promise<Image> {
    requireScope(principal, 'images:write');
    const image = await this.get(principal, target);
    if (image.source.kind === 'builtin') throw errors.validation('target', 'a built-in image cannot be tagged');
    if (!IMAGE_NAME.test(name)) throw errors.validation('name', 'is not an image name');
    for (const [i, tag] of tags.entries()) if (!IMAGE_TAG.test(tag)) throw errors.validation(`tags[${i}]`, 'a tag is 1-128 letters, digits, ".", "_" or "-"');
    await this.db.transaction(async (tx) => {
      for (const tag of tags) await imageRepository(tx).setTag(principal.organizationId, name, tag, image.id);
    });
    return (await imageRepository(this.db).findById(principal.organizationId, image.id))!;
  }

  /**
   * Removes the tag `reference` names. When it was the image's last tag, the image goes too —
   * unless a sandbox still uses it, which is a 409 (as Docker refuses to remove an image a
   * container uses); the images built on top of it keep their own layers (they hold them).
   */
  async delete(principal: Principal, reference: string): Promise<void> {
    requireScope(principal, 'images:write');
    if (BUILTIN_IMAGES.some((name) => reference === name || reference.startsWith(`${name}:`))) throw new NestboxError('conflict', `the built-in image ${reference.slice(0, 200)} cannot be deleted`);
    const image = await this.get(principal, reference);
    const byId = image.id === reference;
    const { name, tag } = byId ? { name: image.name, tag: '' } : parseImageName(reference);
    const users = await imageRepository(this.db).sandboxesUsing(image.id);
    const lastTag = byId || image.tags.length <= 1;
    if (lastTag && users > 0) {
      throw new NestboxError('conflict', `image ${reference} is in use by ${users} sandbox(es); delete them first`, { sandboxes: users });
    }
    await this.db.transaction(async (tx) => {
      const repo = imageRepository(tx);
      if (byId) for (const t of image.tags) await repo.removeTag(principal.organizationId, image.name, t);
      else await repo.removeTag(principal.organizationId, name, tag);
    });
    if (lastTag) await this.collectGarbage({ imageIds: [image.id] });
  }

  /** Records a finished build's or pull's image and points its tags at it, in one transaction. */
  async register(tx: DbOrTx, input: { organizationId: string; name: string; tags: string[]; hostId: string; base: string; snapshotId: string | null; config: ImageConfig; source: ImageSource; buildId: string | null; sizeBytes: number | null }): Promise<{ image: Image; replaced: string[] }> {
    const id = `img${randomId(17)}`;
    await this.checkImageLimit(tx, input.organizationId, input.name, input.tags[0] ?? DEFAULT_TAG);
    const repo = imageRepository(tx);
    await repo.insert({ id, organizationId: input.organizationId, name: input.name, hostId: input.hostId, base: input.base, snapshotId: input.snapshotId, config: input.config, source: input.source, buildId: input.buildId, sizeBytes: input.sizeBytes });
    const replaced: string[] = [];
    for (const tag of input.tags) {
      const previous = await repo.setTag(input.organizationId, input.name, tag, id);
      if (previous) replaced.push(previous);
    }
    return { image: (await repo.findById(input.organizationId, id))!, replaced };
  }

  /**
   * Removes images nothing points at (no tag, no sandbox), then the layers only they held:
   * a layer snapshot goes when no image, no cached step, no sandbox and no other snapshot
   * stacks on it. `imageIds` limits the first pass to those images (a delete's own).
   */
  async collectGarbage(options: { imageIds?: string[]; limit?: number } = {}): Promise<{ images: number; layers: number }> {
    const repo = imageRepository(this.db);
    const candidates = (await repo.unreferenced(options.limit ?? 100)).filter((i) => !options.imageIds || options.imageIds.includes(i.id));
    let layers = 0;
    for (const image of candidates) {
      await repo.markDeleted(image.id);
      if (image.snapshotId) layers += await this.removeLayerChain(image.snapshotId);
      if (image.hostId) await this.removeUnusedBase(image.hostId, image.base);
    }
    return { images: candidates.length, layers };
  }

  /**
   * Drops cached steps unused since `before` (their layers go with them when nothing else needs
   * them). Builds refill the cache; what a ready image uses stays.
   */
  async expireCache(before: Date, limit = 200): Promise<number> {
    const cache = buildCacheRepository(this.db);
    let layers = 0;
    for (const entry of await cache.stale(before, limit)) {
      await cache.remove(entry.organizationId, entry.hostId, entry.key);
      if (entry.snapshotId) layers += await this.removeLayerChain(entry.snapshotId);
      await this.removeUnusedBase(entry.hostId, entry.base);
    }
    return layers;
  }

  /**
   * A pulled OCI image no live image and no cached step starts from any more leaves its host's
   * store (the host refuses while a sandbox there still uses it: that is kept for the next pass).
   */
  private async removeUnusedBase(hostId: string, base: string): Promise<void> {
    if (!base.startsWith('sha256:') || (await imageRepository(this.db).usersOfBase(hostId, base)) > 0) return;
    try {
      await (await this.hosts.clientFor(hostId)).deleteImage(base);
    } catch (err) {
      const e = toNestboxError(err);
      if (e.code !== 'conflict') this.logger.warn({ hostId, image: base, err: e.message }, 'an unused pulled image could not be removed from its host; kept for the next collection');
    }
  }

  /** Removes the layer and then its parents, each only while nothing uses it. Answers how many went. */
  async removeLayerChain(snapshotId: string): Promise<number> {
    let removed = 0;
    let next: string | null = snapshotId;
    for (let depth = 0; next && depth < 1000; depth++) {
      const snapshot = await snapshotRepository(this.db).findById(next);
      if (!snapshot || snapshot.kind !== 'layer' || snapshot.deletedAt) return removed;
      const inUse =
        (await imageRepository(this.db).liveImagesOnSnapshot(snapshot.id)) +
        (await buildCacheRepository(this.db).entriesOnSnapshot(snapshot.id)) +
        (await sandboxRepository(this.db).countUsingSnapshot(snapshot.id)) +
        (await snapshotRepository(this.db).countChildren(snapshot.id));
      if (inUse > 0) return removed;
      if (!(await snapshotRepository(this.db).transition(snapshot.id, 'ready', 'deleting')) && snapshot.state !== 'error') return removed;
      try {
        await (await this.hosts.clientFor(snapshot.hostId)).deleteSnapshot(snapshot.id);
      } catch (err) {
        await snapshotRepository(this.db).update(snapshot.id, { state: 'ready' });
        this.logger.warn({ snapshotId: snapshot.id, err: toNestboxError(err).message }, 'a build layer could not be removed from its host; kept for the next collection');
        return removed;
      }
      await snapshotRepository(this.db).update(snapshot.id, { deletedAt: new Date() });
      removed++;
      next = snapshot.parentSnapshotId;
    }
    return removed;
  }

  /** The image's layers, topmost first (its build's snapshots down the chain). */
  async layersOf(image: Image): Promise<{ id: string; sizeBytes: number | null; createdAt: Date }[]> {
    const layers: { id: string; sizeBytes: number | null; createdAt: Date }[] = [];
    let next = image.snapshotId;
    for (let depth = 0; next && depth < 1000; depth++) {
      const snapshot = await snapshotRepository(this.db).findById(next);
      if (!snapshot || snapshot.organizationId !== image.organizationId) break;
      layers.push({ id: snapshot.id, sizeBytes: snapshot.sizeBytes, createdAt: snapshot.createdAt });
      next = snapshot.parentSnapshotId;
    }
    return layers;
  }

  /** What the host of a sandbox of this image needs: its base, its layers and its environment. */
  startPoint(image: Image): { hostImage: string; snapshotId: string | null; hostId: string | null; env: Record<string, string> } {
    const env: Record<string, string> = {};
    for (const [k, v] of image.config.env) env[k] = v;
    return { hostImage: image.base, snapshotId: image.snapshotId, hostId: image.hostId, env };
  }

  /** The image a sandbox was created from (for DTOs); undefined for the built-in one and older rows. */
  async ofSandbox(sandbox: Pick<Sandbox, 'imageId' | 'organizationId'>): Promise<Image | undefined> {
    if (!sandbox.imageId) return undefined;
    return imageRepository(this.db).findById(sandbox.organizationId, sandbox.imageId);
  }
}

function encodeCursor(i: Pick<Image, 'createdAt' | 'id'>): string {
  return Buffer.from(`${i.createdAt.toISOString()}|${i.id}`).toString('base64url');
}

function decodeCursor(cursor: string): { createdAt: Date; id: string } {
  const [iso, id] = Buffer.from(cursor, 'base64url').toString('utf8').split('|');
  const createdAt = new Date(iso ?? '');
  if (!id || Number.isNaN(createdAt.getTime())) throw errors.validation('cursor', 'is not a cursor returned by this API');
  return { createdAt, id };
}

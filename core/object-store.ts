// What core needs of object storage: build contexts (tars) uploaded by clients before a build,
// read by the build engine when a COPY runs. Every object belongs to one organisation; a key is
// never resolved across organisations. The implementation (a directory under the data dir, or
// an operator's S3-compatible store) is chosen by the composition root (src/); the native API,
// E2B's upload links and Daytona's S3 endpoint all put objects through this interface.
import type { Readable } from 'node:stream';

export interface StoredObject {
  /** Key inside the organisation, e.g. `contexts/sha256:<hex>.tar`, `<hash>/context.tar`. */
  key: string;
  size: number;
  /** Hex SHA-256 of the content. */
  sha256: string;
  /** S3-style entity tag: a quoted hex digest (MD5 for single-part objects). */
  etag: string;
  createdAt: Date;
}

export interface PutObjectOptions {
  /** Refuse (payload_too_large) once the body passes this many bytes; nothing is kept. */
  maxBytes?: number;
  /** Refuse (validation_failed, field `sha256`) when the content's SHA-256 differs; nothing is kept. */
  expectSha256?: string;
  signal?: AbortSignal;
}

export interface ObjectStore {
  /** Stores the body under the key (replacing an existing object atomically). */
  put(organizationId: string, key: string, body: Readable, options?: PutObjectOptions): Promise<StoredObject>;
  head(organizationId: string, key: string): Promise<StoredObject | undefined>;
  /** The object's bytes; `not_found` when absent. */
  read(organizationId: string, key: string): Promise<Readable>;
  /** Objects whose key starts with `prefix`, in key order, after `startAfter`, at most `limit`. */
  list(organizationId: string, prefix: string, options?: { startAfter?: string; limit?: number }): Promise<StoredObject[]>;
  /** Idempotent. */
  delete(organizationId: string, key: string): Promise<void>;

  // Multipart uploads (S3's CreateMultipartUpload / UploadPart / Complete / Abort): parts may
  // arrive in any order and concurrently; nothing is visible under the key until complete.
  createMultipart(organizationId: string, key: string): Promise<{ uploadId: string }>;
  putPart(organizationId: string, uploadId: string, partNumber: number, body: Readable, options?: PutObjectOptions): Promise<{ etag: string; size: number }>;
  completeMultipart(organizationId: string, uploadId: string, parts: { partNumber: number; etag: string }[]): Promise<StoredObject>;
  abortMultipart(organizationId: string, uploadId: string): Promise<void>;
}

/** The key under which the native API and the build engine keep an uploaded context tar. */
export function contextObjectKey(sha256Hex: string): string {
  return `contexts/${sha256Hex}.tar`;
}

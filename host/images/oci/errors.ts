// Errors of pulling and storing images, with codes of core's catalogue (core/errors.ts) so a
// caller's mistake (a bad reference, a tag that does not exist, wrong credentials) reaches the
// client as 400/404/401 and only a broken registry or host is a 5xx.
export type ImageErrorCode = 'validation_failed' | 'not_found' | 'unauthorized' | 'timeout' | 'host_unavailable' | 'internal';

export class ImageError extends Error {
  constructor(
    readonly code: ImageErrorCode,
    message: string,
  ) {
    super(message);
    this.name = 'ImageError';
  }
}

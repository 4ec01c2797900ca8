// How a failed skopeo/umoci run becomes the catalogue's error code, from its stderr.
import { describe, expect, it } from 'vitest';
import { classifyFailure } from './tools.js';

const fatal = (msg: string) => `time="2026-12-03T00:00:00Z" level=fatal msg="${msg}"\n`;

describe('classifyFailure', () => {
  it('reads a registry refusal as unauthorized even when the registry port contains 404', () => {
    const error = classifyFailure('skopeo', 'copy', fatal('initializing source docker://127.0.0.1:40412/private/busybox:1: reading manifest 1 in 127.0.0.1:40412/private/busybox: unauthorized: authentication required'), 'exit 1');
    expect(error.code).toBe('unauthorized');
  });

  it('reads a missing tag as not_found even when the port contains 401', () => {
    const error = classifyFailure('skopeo', 'copy', fatal('initializing source docker://127.0.0.1:40150/test/busybox:no-such-tag: reading manifest no-such-tag in 127.0.0.1:40150/test/busybox: manifest unknown'), 'exit 1');
    expect(error.code).toBe('not_found');
  });

  it('reads bare status codes as whole words', () => {
    expect(classifyFailure('skopeo', 'copy', fatal('received unexpected HTTP status: 404 Not Found'), 'exit 1').code).toBe('not_found');
    expect(classifyFailure('skopeo', 'copy', fatal('received unexpected HTTP status: 403 Forbidden'), 'exit 1').code).toBe('unauthorized');
    expect(classifyFailure('skopeo', 'copy', fatal('pinging container registry 127.0.0.1:14045: connection refused'), 'exit 1').code).toBe('host_unavailable');
  });
});

// Which Daytona daemon code a toolbox error gets (compat/daytona/errors.ts): what the guest said
// about a file, process or session selects the SDK's specific class (DaytonaFileNotFoundError…);
// an error about the sandbox itself keeps its plain shape (DaytonaNotFoundError).
import { describe, expect, it } from 'vitest';
import { errors, NestboxError } from '../../core/errors.js';
import { daemonCall, daytonaErrorBody, FILE_CODES, PROCESS_CODES, withDaemonCode } from '../../compat/daytona/errors.js';

const body = (err: unknown) => daytonaErrorBody(err as NestboxError, 'toolbox', '/daytona/toolbox/x/files/info', 'GET');

describe('Daytona daemon codes of toolbox errors', () => {
  it('gives a guest file or process error its daemon code and source', () => {
    expect(body(withDaemonCode(new NestboxError('not_found', 'no such file or directory: /root/x'), FILE_CODES))).toMatchObject({
      statusCode: 404, code: 'FILE_NOT_FOUND', source: 'DAYTONA_DAEMON', message: 'no such file or directory: /root/x',
    });
    expect(body(withDaemonCode(new NestboxError('forbidden', 'permission denied: /root/x'), FILE_CODES))).toMatchObject({ statusCode: 403, code: 'FILE_ACCESS_DENIED' });
    expect(body(withDaemonCode(new NestboxError('not_found', 'no process p1'), PROCESS_CODES))).toMatchObject({ code: 'PROCESS_NOT_FOUND', source: 'DAYTONA_DAEMON' });
    expect(body(withDaemonCode(new NestboxError('invalid_state', 'the session ended'), { ...PROCESS_CODES, invalid_state: 'SESSION_ENDED' }))).toMatchObject({ statusCode: 409, code: 'SESSION_ENDED' });
  });

  it('leaves errors about the sandbox, codes without a mapping, and named codes alone', async () => {
    const missing = errors.notFound('sandbox', 'abc');
    expect(withDaemonCode(missing, FILE_CODES)).toBe(missing);
    expect(body(missing)).not.toHaveProperty('source');
    const stopped = errors.invalidState('sandbox', 'abc', 'stopped', ['running'], 'run commands in');
    expect(withDaemonCode(stopped, { ...PROCESS_CODES, invalid_state: 'SESSION_ENDED' })).toBe(stopped);
    const bad = new NestboxError('validation_failed', 'path: must be absolute');
    expect(withDaemonCode(bad, FILE_CODES)).toBe(bad);
    const named = new NestboxError('not_found', 'PTY session p not found', { daytonaCode: 'PROCESS_NOT_FOUND' });
    expect(withDaemonCode(named, FILE_CODES)).toBe(named);
    await expect(daemonCall(FILE_CODES, Promise.reject(new NestboxError('not_found', 'gone')))).rejects.toMatchObject({ details: { daytonaCode: 'FILE_NOT_FOUND' } });
    await expect(daemonCall(FILE_CODES, Promise.resolve(7))).resolves.toBe(7);
  });
});

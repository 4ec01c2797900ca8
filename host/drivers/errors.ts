// Typed driver errors: a caller's mistake (unknown sandbox, name taken, wrong state) must reach
// the control plane as 404/409/400, never as a 500 that looks like a broken host. The host agent
// maps `code` to an HTTP status; everything without one of these codes is a real failure.

export type DriverErrorCode = 'not_found' | 'conflict' | 'invalid_state' | 'validation_failed' | 'not_supported';

export class DriverError extends Error {
  constructor(
    readonly code: DriverErrorCode,
    message: string,
  ) {
    super(message);
    this.name = 'DriverError';
  }
}

const STATUS_BY_CODE: Record<DriverErrorCode, number> = {
  not_found: 404,
  conflict: 409,
  invalid_state: 409,
  validation_failed: 400,
  not_supported: 501,
};

/**
 * The HTTP status and code for a driver error, or undefined for anything else. Duck-typed on
 * `code` so that errors thrown as `Object.assign(new Error(…), { code: 'conflict' })` count too,
 * while Node's system errors (code `ENOENT`…) do not.
 */
export function driverErrorStatus(error: unknown): { status: number; code: DriverErrorCode } | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  if (typeof code !== 'string' || !(code in STATUS_BY_CODE)) return undefined;
  return { status: STATUS_BY_CODE[code as DriverErrorCode], code: code as DriverErrorCode };
}

// The one logging interface every layer codes against. It is the narrow part of pino's API that
// the code uses, so a pino logger is one as it is (src/logger.ts builds it where a process
// starts) and core and host never depend on pino's own types. A record is a human sentence plus
// fields; ids go in fields, not in the sentence, so a log store can filter on them.

/** The levels NESTBOX_LOG_LEVEL accepts, least severe first (pino's names for them). */
export const LOG_LEVELS = ['debug', 'info', 'warn', 'error'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

/**
 * The field names in use, so one thing is always found under one key. Anything else may be
 * added; `err` takes an Error and is written with its type, message and stack.
 */
export interface KnownLogFields {
  /** The sandbox the line is about. */
  sandboxId?: string;
  /** The lifecycle operation (create, start, stop, pause, unpause, fork, snapshot, delete, …). */
  operation?: string;
  /** One HTTP request through the control plane (src/http/request-id.ts). */
  requestId?: string;
  /** The host agent the line comes from or is about. */
  hostId?: string;
  /** The part of the program that writes the line (supervisor, host-agent, background, …). */
  component?: string;
  err?: unknown;
}
export type LogFields = KnownLogFields & Record<string, unknown>;

export interface LogMethod {
  (message: string): void;
  (fields: LogFields, message: string): void;
}

export interface Logger {
  debug: LogMethod;
  info: LogMethod;
  warn: LogMethod;
  error: LogMethod;
  /** A logger that adds these fields to every line it writes. */
  child(bindings: LogFields): Logger;
}

/** Writes nothing: the default of an option nobody set (tests, tools). */
export const silentLogger: Logger = {
  debug: () => undefined,
  info: () => undefined,
  warn: () => undefined,
  error: () => undefined,
  child: () => silentLogger,
};

/** What a last-resort error renderer needs of a logger (core/errors.ts publicError). */
export type ErrorLog = Pick<Logger, 'error'>;

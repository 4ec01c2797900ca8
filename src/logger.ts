// The pino logger behind core's Logger interface, built once where a process starts (server,
// worker, supervisor, host agent). JSON lines, one record each, on stdout: what log collectors
// (journald, Docker, Loki, Cloud Logging) take as they are. No transports: they run in worker
// threads and the program has no use for them.
import { pino, stdTimeFunctions, type DestinationStream } from 'pino';
import type { LogFields, Logger, LogLevel } from '../core/logger.js';

export interface LoggerOptions {
  /** NESTBOX_LOG_LEVEL (config.logLevel): lines below it are dropped before they are formatted. */
  level: LogLevel;
  /** Fields on every line (e.g. the component or host id). */
  base?: LogFields;
}

/**
 * A pino logger writing to `destination` (stdout unless given; tests pass a stream that keeps
 * the lines). `level` is written as its name ("info"), `time` as an ISO timestamp.
 */
export function createLogger(options: LoggerOptions, destination?: DestinationStream): Logger {
  const logger = pino(
    {
      level: options.level,
      base: { pid: process.pid, ...options.base },
      timestamp: stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    destination ?? pino.destination({ fd: 1, sync: true }),
  );
  return logger;
}

const LEVEL_OF: Record<string, keyof Pick<Logger, 'debug' | 'info' | 'warn' | 'error'>> = {
  trace: 'debug', debug: 'debug', info: 'info', warn: 'warn', error: 'error', fatal: 'error',
};

/**
 * Pass on one line a child process wrote: a JSON record from its own createLogger keeps its
 * level, message and fields (its own `component`, `hostId`, …: `logger` should add none of
 * them again); anything else (a crash's stack trace, a tool's output) goes to `otherwise`. The
 * child filtered by the same NESTBOX_LOG_LEVEL already.
 */
export function relayChildLine(logger: Logger, line: string, otherwise: (line: string) => void): void {
  if (line.startsWith('{')) {
    try {
      const record = JSON.parse(line) as Record<string, unknown>;
      const level = typeof record.level === 'string' ? LEVEL_OF[record.level] : undefined;
      if (level && typeof record.msg === 'string') {
        // Our own time and pid are written on the relayed line; the child's pid is kept apart.
        const { level: _level, time: _time, msg, pid, hostname: _hostname, ...fields } = record;
        logger[level]({ ...fields, childPid: pid }, msg);
        return;
      }
    } catch {
      // Not JSON after all: relayed as text below.
    }
  }
  otherwise(line);
}

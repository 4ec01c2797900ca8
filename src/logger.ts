// The pino logger behind core's Logger interface, built once where a process starts (server,
// worker, supervisor, host agent). JSON lines, one record each, on stdout: what log collectors
// (journald, Docker, Loki, Cloud Logging) take as they are. No transports: they run in worker
// threads and the program has no use for them.
import { pino, stdTimeFunctions, type DestinationStream } from 'pino';
import { context, trace } from '@opentelemetry/api';
import type { LogFields, Logger, LogLevel } from '../core/logger.js';

/**
 * Field names whose values are secrets: API keys (`nbx_…`), sandbox credentials (E2B envd access
 * tokens, Daytona preview tokens, hosted-port tokens), the host secret, webhook signing secrets,
 * passwords (registry credentials), organisation secrets' values and environments that may hold
 * them (`secretValue`, `env`, `envs`, `envVars`), and the headers that carry them. Wherever one appears in a
 * line's fields, up to three objects down (`headers.authorization`, `err.config.headers.…`),
 * pino writes `[redacted]` instead. Sentences are not searched: nothing puts a secret in one
 * (test/logs.test.ts checks the lines of a whole sandbox life for the key and the tokens).
 */
export const SECRET_FIELDS = [
  'authorization', 'Authorization', 'proxy-authorization', 'cookie', 'set-cookie',
  'x-api-key', 'X-API-Key', 'x-access-token', 'X-Access-Token', 'x-daytona-preview-token', 'x-nestbox-port-token', 'x-amz-security-token',
  'apiKey', 'api_key', 'key', 'secret', 'secrets', 'hostSecret', 'webhookSecret', 'signingSecret', 'password', 'passwd', 'credentials',
  'secretValue', 'env', 'envs', 'envVars',
  'token', 'accessToken', 'access_token', 'envdAccessToken', 'trafficAccessToken', 'previewToken', 'refreshToken', 'bootstrapApiKey',
] as const;

/** pino's redact paths for SECRET_FIELDS at the top of a line and up to three objects down. */
function redactPaths(): string[] {
  return SECRET_FIELDS.flatMap((name) => {
    const at = /^[A-Za-z_$][\w$]*$/.test(name) ? `.${name}` : `["${name}"]`;
    return [at.startsWith('.') ? name : at, `*${at}`, `*.*${at}`, `*.*.*${at}`];
  });
}

/** The active span's ids on every line written inside one (tracing on: src/tracing.ts). */
function traceFields(): Record<string, string> {
  const span = trace.getSpan(context.active());
  if (!span) return {};
  const { traceId, spanId } = span.spanContext();
  return { traceId, spanId };
}

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
      redact: { paths: redactPaths(), censor: '[redacted]' },
      mixin: traceFields,
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

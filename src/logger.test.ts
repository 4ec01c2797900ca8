import http from 'node:http';
import express from 'express';
import supertest from 'supertest';
import { describe, expect, it } from 'vitest';
import type { Logger } from '../core/logger.js';
import { loadConfig } from './config.js';
import { createLogger, relayChildLine } from './logger.js';
import { assignRequestIds, noteRequest, requestLogger } from './http/request-id.js';
import { context, trace, TraceFlags } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';

/** A real pino logger whose JSON lines are kept, parsed. */
function recorded(level: 'debug' | 'info' | 'warn' | 'error', base?: Record<string, unknown>): { logger: Logger; records: Record<string, unknown>[] } {
  const records: Record<string, unknown>[] = [];
  const logger = createLogger({ level, base }, { write: (line) => records.push(JSON.parse(line)) });
  return { logger, records };
}

describe('logger', () => {
  it('drops lines below its level and keeps the rest, each a JSON record with level name, time and pid', () => {
    const { logger, records } = recorded('info');
    logger.debug('not written');
    logger.info('one');
    logger.warn('two');
    logger.error('three');
    expect(records.map((r) => [r.level, r.msg])).toEqual([['info', 'one'], ['warn', 'two'], ['error', 'three']]);
    expect(records[0].pid).toBe(process.pid);
    expect(Date.parse(records[0].time as string)).toBeGreaterThan(0);

    const quiet = recorded('error');
    quiet.logger.info('no');
    quiet.logger.warn('no');
    quiet.logger.error('yes');
    expect(quiet.records.map((r) => r.msg)).toEqual(['yes']);

    const chatty = recorded('debug');
    chatty.logger.debug('written');
    expect(chatty.records.map((r) => [r.level, r.msg])).toEqual([['debug', 'written']]);
  });

  it('honours NESTBOX_LOG_LEVEL through the config', () => {
    const config = loadConfig({ NESTBOX_LOG_LEVEL: 'warn' });
    const records: unknown[] = [];
    const logger = createLogger({ level: config.logLevel }, { write: (line) => records.push(JSON.parse(line)) });
    logger.info('dropped');
    logger.warn('kept');
    expect(records).toEqual([expect.objectContaining({ level: 'warn', msg: 'kept' })]);
    expect(loadConfig({}).logLevel).toBe('info');
  });

  it('writes child bindings, base fields and per-line fields as fields, and an err with its stack', () => {
    const { logger, records } = recorded('info', { component: 'test' });
    const child = logger.child({ sandboxId: 'sb1', operation: 'stop' });
    child.child({ requestId: 'r-1' }).warn({ ms: 12, err: new Error('boom') }, 'stop failed');
    expect(records).toHaveLength(1);
    expect(records[0]).toMatchObject({ level: 'warn', msg: 'stop failed', component: 'test', sandboxId: 'sb1', operation: 'stop', requestId: 'r-1', ms: 12 });
    expect(records[0].err).toMatchObject({ type: 'Error', message: 'boom', stack: expect.stringContaining('boom') });
    // The parent is unchanged by its child.
    logger.info('plain');
    expect(records[1]).not.toHaveProperty('sandboxId');
  });

  it('relays a child process\'s records with their level and fields, and other text as given', () => {
    const { logger, records } = recorded('debug');
    const texts: string[] = [];
    const child = recorded('info', { component: 'host-agent', hostId: 'h1' });
    child.logger.child({ sandboxId: 'sb2' }).error('create failed: no space');
    relayChildLine(logger, JSON.stringify(child.records[0]), (line) => texts.push(line));
    relayChildLine(logger, 'Error: a stack trace line', (line) => texts.push(line));
    relayChildLine(logger, '{not json', (line) => texts.push(line));
    expect(records).toHaveLength(1);
    expect(records[0]).toMatchObject({ level: 'error', msg: 'create failed: no space', component: 'host-agent', hostId: 'h1', sandboxId: 'sb2', childPid: process.pid });
    expect(texts).toEqual(['Error: a stack trace line', '{not json']);
  });
});

describe('request ids', () => {
  function app(logger: Logger) {
    const app = express();
    app.use(assignRequestIds(logger));
    app.get('/x', (req, res) => {
      requestLogger(req, logger).info('inside');
      res.status(204).end();
    });
    return http.createServer(app);
  }

  it('puts one id per request on its lines, keeping a caller\'s plain X-Request-Id and replacing a malformed one', async () => {
    const { logger, records } = recorded('debug');
    const server = app(logger);
    try {
      await supertest(server).get('/x?token=secret').set('x-request-id', 'caller-id.1').expect(204);
      await supertest(server).get('/x').set('x-request-id', 'bad id "level":"error"').expect(204);
      await supertest(server).get('/x').expect(204);
    } finally {
      server.close();
    }
    const inside = records.filter((r) => r.msg === 'inside');
    expect(inside.map((r) => r.requestId)).toEqual(['caller-id.1', expect.stringMatching(/^[0-9a-f-]{36}$/), expect.stringMatching(/^[0-9a-f-]{36}$/)]);
    expect(inside[1].requestId).not.toBe(inside[2].requestId);
    // One debug line per answered request, with the same id and no query string.
    const done = records.filter((r) => r.level === 'debug');
    expect(done.map((r) => r.requestId)).toEqual(inside.map((r) => r.requestId));
    expect(done[0]).toMatchObject({ method: 'GET', path: '/x', status: 204, msg: 'GET /x 204' });
    expect(JSON.stringify(records)).not.toContain('secret');
  });

  it('adds what a front door learnt (organisation, sandbox) to the request\'s later lines and its finished line', async () => {
    const { logger, records } = recorded('debug');
    const app = express();
    app.use(assignRequestIds(logger));
    app.get('/y', (req, res) => {
      noteRequest(req, { operation: 'getSandbox', organizationId: 'org-1', sandboxId: 'sb-1' });
      requestLogger(req, logger).info('after');
      res.status(204).end();
    });
    const server = http.createServer(app);
    try {
      await supertest(server).get('/y').expect(204);
    } finally {
      server.close();
    }
    expect(records.find((r) => r.msg === 'after')).toMatchObject({ organizationId: 'org-1', sandboxId: 'sb-1', requestId: expect.any(String) });
    expect(records.find((r) => r.level === 'debug')).toMatchObject({ organizationId: 'org-1', sandboxId: 'sb-1', status: 204 });
    expect(records.every((r) => !('operation' in r))).toBe(true);
  });
});

describe('secrets and traces in log lines', () => {
  it('redacts keys, tokens, passwords, secrets and Authorization headers wherever they sit in the fields', () => {
    const { logger, records } = recorded('info');
    logger.child({ token: 'nbx_child_binding' }).info(
      {
        authorization: 'Bearer nbx_top',
        headers: { authorization: 'Bearer nbx_header', 'x-api-key': 'nbx_e2b_header', 'x-access-token': 'envd-token-1' },
        err: { config: { headers: { Authorization: 'Bearer nbx_deep' } } },
        apiKey: 'nbx_field',
        sandbox: { envdAccessToken: 'envd-token-2', id: 'sb-1' },
        webhook: { secret: 'whsec_1' },
        credentials: { username: 'u', password: 'pw-1' },
        kept: 'visible',
      },
      'a line with secrets in its fields',
    );
    const line = JSON.stringify(records[0]);
    for (const secret of ['nbx_child_binding', 'nbx_top', 'nbx_header', 'nbx_e2b_header', 'envd-token-1', 'nbx_deep', 'nbx_field', 'envd-token-2', 'whsec_1', 'pw-1']) expect(line).not.toContain(secret);
    expect(records[0]).toMatchObject({ kept: 'visible', sandbox: { id: 'sb-1', envdAccessToken: '[redacted]' }, headers: { authorization: '[redacted]' } });
  });

  it('carries the active span\'s trace and span ids, and none outside a span', () => {
    const manager = new AsyncLocalStorageContextManager().enable();
    context.setGlobalContextManager(manager);
    try {
      const { logger, records } = recorded('info');
      const spanContext = { traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: TraceFlags.SAMPLED };
      context.with(trace.setSpanContext(context.active(), spanContext), () => logger.info('inside a span'));
      logger.info('outside');
      expect(records[0]).toMatchObject({ msg: 'inside a span', traceId: spanContext.traceId, spanId: spanContext.spanId });
      expect(records[1]).not.toHaveProperty('traceId');
    } finally {
      context.disable();
    }
  });
});

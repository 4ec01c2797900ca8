import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from './config.js';

describe('config', () => {
  it('has embedded defaults: port 7070 on loopback, PGlite under ./.nestbox', () => {
    const c = loadConfig({});
    expect(c.port).toBe(7070);
    expect(c.host).toBe('127.0.0.1');
    expect(c.dataDir).toMatch(/\/\.nestbox$/);
    expect(c.database).toEqual({ kind: 'pglite', directory: `${c.dataDir}/pglite` });
    expect(c.imagesDir).toBe(`${c.dataDir}/images`);
  });

  it('has stream caps and slow-client timeouts with defaults, and checks them', () => {
    const c = loadConfig({});
    expect(c.limits.maxStreamsPerKey).toBe(256);
    expect(c.limits.maxStreamsPerSandbox).toBe(64);
    expect(c.http).toEqual({ headersTimeoutMs: 60_000, requestTimeoutMs: 3_600_000, bodyIdleTimeoutMs: 30_000, upgradeTimeoutMs: 90_000 });
    expect(c.serverSupervisor).toBe(true);
    expect(() => loadConfig({ NESTBOX_HEADERS_TIMEOUT_MS: '5000', NESTBOX_REQUEST_TIMEOUT_MS: '1000' })).toThrow(/NESTBOX_HEADERS_TIMEOUT_MS/);
    expect(() => loadConfig({ NESTBOX_MAX_STREAMS_PER_KEY: '0' })).toThrow(ConfigError);
    expect(loadConfig({ NESTBOX_REQUEST_TIMEOUT_MS: '0' }).http.requestTimeoutMs).toBe(0);
  });

  it('uses PostgreSQL when a URL is given', () => {
    expect(loadConfig({ NESTBOX_DATABASE_URL: 'postgres://u:p@db/x' }).database).toEqual({ kind: 'postgres', url: 'postgres://u:p@db/x' });
  });

  it.each([
    ['NESTBOX_PORT', 'seventy'],
    ['NESTBOX_PORT', '70000'],
    ['NESTBOX_DATABASE_URL', 'mysql://x'],
    ['NESTBOX_BOOTSTRAP_API_KEY', 'nbx_short'],
    ['NESTBOX_HOST_SECRET', 'tooshort'],
  ])('names the variable when %s=%s is invalid', (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(ConfigError);
    expect(() => loadConfig({ [name]: value })).toThrow(new RegExp(name));
  });

  it('refuses a misspelt NESTBOX_ variable but ignores the test suite’s own', () => {
    expect(() => loadConfig({ NESTBOX_PROT: '1' })).toThrow(/NESTBOX_PROT: unknown setting/);
    expect(() => loadConfig({ NESTBOX_TEST_IMAGES_DIR: '/x' })).not.toThrow();
  });
});

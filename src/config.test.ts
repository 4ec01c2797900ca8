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

  it('has generous request rate limits per key and per organisation; 0 turns one off', () => {
    expect(loadConfig({}).rateLimits).toEqual({ key: { perSecond: 1000, burst: 2000 }, organization: { perSecond: 5000, burst: 10_000 }, leaseTokens: 10 });
    const c = loadConfig({ NESTBOX_RATE_LIMIT_KEY_PER_SECOND: '0.5', NESTBOX_RATE_LIMIT_KEY_BURST: '3', NESTBOX_RATE_LIMIT_ORG_PER_SECOND: '0' });
    expect(c.rateLimits).toEqual({ key: { perSecond: 0.5, burst: 3 }, organization: undefined, leaseTokens: 10 });
    expect(() => loadConfig({ NESTBOX_RATE_LIMIT_KEY_PER_SECOND: '-1' })).toThrow(/NESTBOX_RATE_LIMIT_KEY_PER_SECOND/);
    expect(() => loadConfig({ NESTBOX_RATE_LIMIT_ORG_BURST: '0' })).toThrow(/NESTBOX_RATE_LIMIT_ORG_BURST/);
    expect(() => loadConfig({ NESTBOX_RATE_LIMIT_LEASE: '1.5' })).toThrow(/NESTBOX_RATE_LIMIT_LEASE/);
  });

  it('reads the OCI image settings: store dir, mirrors in order, insecure registries', () => {
    const defaults = loadConfig({ NESTBOX_DATA_DIR: '/srv/nbx' });
    expect(defaults.images).toEqual({ ociStoreDir: '/srv/nbx/images/oci', mirrors: {}, insecureRegistries: [], pullTimeoutMs: 1_800_000 });
    const c = loadConfig({
      NESTBOX_OCI_STORE_DIR: '/var/lib/oci',
      NESTBOX_REGISTRY_MIRRORS: 'docker.io=mirror.example.com/hub,docker.io=10.0.0.5:5000,ghcr.io=gh.example.com',
      NESTBOX_INSECURE_REGISTRIES: '10.0.0.5:5000,registry.lan',
    });
    expect(c.images.ociStoreDir).toBe('/var/lib/oci');
    expect(c.images.mirrors).toEqual({ 'docker.io': ['mirror.example.com/hub', '10.0.0.5:5000'], 'ghcr.io': ['gh.example.com'] });
    expect(c.images.insecureRegistries).toEqual(['10.0.0.5:5000', 'registry.lan']);
    expect(() => loadConfig({ NESTBOX_REGISTRY_MIRRORS: 'docker.io' })).toThrow(/NESTBOX_REGISTRY_MIRRORS/);
    expect(() => loadConfig({ NESTBOX_REGISTRY_MIRRORS: 'docker.io=https://mirror' })).toThrow(/NESTBOX_REGISTRY_MIRRORS/);
    expect(() => loadConfig({ NESTBOX_INSECURE_REGISTRIES: 'a b' })).toThrow(/NESTBOX_INSECURE_REGISTRIES/);
  });

  it('names the region of its hosts (Daytona target): local by default, a lowercase name', () => {
    expect(loadConfig({}).region).toBe('local');
    expect(loadConfig({ NESTBOX_REGION: 'eu-1' }).region).toBe('eu-1');
    expect(() => loadConfig({ NESTBOX_REGION: 'EU 1' })).toThrow(/NESTBOX_REGION/);
  });

  it('parses host labels, capacity overrides and the placement settings, refusing bad ones by name', () => {
    const c = loadConfig({ NESTBOX_HOST_LABELS: 'region=eu-central,disk=ssd,topology.k/zone=a_1', NESTBOX_HOST_CAPACITY_MEMORY_MIB: '2048', NESTBOX_MEMORY_OVERCOMMIT: '1.25', NESTBOX_HOST_LOST_AFTER_MS: '5000' });
    expect(c.hostAgent.labels).toEqual({ region: 'eu-central', disk: 'ssd', 'topology.k/zone': 'a_1' });
    expect(c.hostAgent.capacityOverride).toEqual({ cpu: undefined, memoryMiB: 2048, diskGiB: undefined });
    expect(c.placement).toMatchObject({ memoryOvercommit: 1.25, cpuOvercommit: 16, diskOvercommit: 4, reserveMemoryMiB: 512, reserveCpu: 0, hostLostAfterMs: 5000 });
    expect(loadConfig({}).hostAgent.labels).toEqual({});
    expect(() => loadConfig({ NESTBOX_HOST_LABELS: 'region' })).toThrow(/NESTBOX_HOST_LABELS/);
    expect(() => loadConfig({ NESTBOX_HOST_LABELS: 'Region=eu' })).toThrow(/NESTBOX_HOST_LABELS/);
    expect(() => loadConfig({ NESTBOX_HOST_LABELS: 'region=eu central' })).toThrow(/NESTBOX_HOST_LABELS/);
    expect(() => loadConfig({ NESTBOX_HOST_LABELS: 'region=a,region=b' })).toThrow(/NESTBOX_HOST_LABELS: label region is given twice/);
    expect(() => loadConfig({ NESTBOX_CPU_OVERCOMMIT: '0' })).toThrow(/NESTBOX_CPU_OVERCOMMIT/);
    expect(() => loadConfig({ NESTBOX_HOST_LOST_AFTER_MS: '10' })).toThrow(/NESTBOX_HOST_LOST_AFTER_MS/);
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

  it('turns the reflink store on by default and has quota defaults', () => {
    const c = loadConfig({});
    expect(c.hostAgent.reflinkStore).toBe('auto');
    expect(c.limits).toMatchObject({ defaultDiskGiB: 10, maxDiskGiB: 100, diskInodesPerGiB: 65_536 });
    expect(c.orgLimits).toEqual({ maxSandboxes: 50, maxCpu: 64, maxMemoryMiB: 131_072, maxDiskGiB: 2048, maxSnapshots: 500, maxImages: 200, retryAfterSeconds: 30 });
    expect(loadConfig({ NESTBOX_REFLINK_STORE: 'off' }).hostAgent.reflinkStore).toBe('off');
    expect(() => loadConfig({ NESTBOX_DEFAULT_DISK_GIB: '20', NESTBOX_MAX_DISK_GIB: '10' })).toThrow(/NESTBOX_DEFAULT_DISK_GIB: must not exceed NESTBOX_MAX_DISK_GIB/);
    expect(() => loadConfig({ NESTBOX_ORG_MAX_SANDBOXES: '0' })).toThrow(/NESTBOX_ORG_MAX_SANDBOXES/);
  });

  it('builds the code-interpreter image in the background by default, or on demand', () => {
    expect(loadConfig({}).hostAgent.codeInterpreterImage).toBe('background');
    expect(loadConfig({ NESTBOX_CODE_INTERPRETER_IMAGE: 'on-demand' }).hostAgent.codeInterpreterImage).toBe('on-demand');
    expect(() => loadConfig({ NESTBOX_CODE_INTERPRETER_IMAGE: 'never' })).toThrow(/NESTBOX_CODE_INTERPRETER_IMAGE/);
  });

  it('bounds minted credentials and signed URLs, and keeps a URL from outliving its credential', () => {
    expect(loadConfig({}).tokens).toEqual({ sandboxTokenTtlSeconds: 86_400, signedUrlMaxSeconds: 43_200 });
    expect(() => loadConfig({ NESTBOX_SIGNED_URL_MAX_SECONDS: '86400' })).toThrow(/NESTBOX_SIGNED_URL_MAX_SECONDS: must be less than NESTBOX_SANDBOX_TOKEN_TTL_SECONDS/);
    expect(() => loadConfig({ NESTBOX_SANDBOX_TOKEN_TTL_SECONDS: '0' })).toThrow(/NESTBOX_SANDBOX_TOKEN_TTL_SECONDS/);
  });

  it('finds the CLI\'s profile file under XDG_CONFIG_HOME, else ~/.config, unless NESTBOX_PROFILE_FILE names one', () => {
    expect(loadConfig({ XDG_CONFIG_HOME: '/cfg', HOME: '/home/u' }).client).toEqual({ url: undefined, apiKey: undefined, profileFile: '/cfg/nestbox/profiles.json', profile: 'default' });
    expect(loadConfig({ HOME: '/home/u' }).client.profileFile).toBe('/home/u/.config/nestbox/profiles.json');
    const c = loadConfig({ NESTBOX_PROFILE_FILE: '/etc/nbx.json', NESTBOX_PROFILE: 'staging', NESTBOX_URL: 'http://10.0.0.1:7070/', NESTBOX_API_KEY: 'k' });
    expect(c.client).toEqual({ url: 'http://10.0.0.1:7070', apiKey: 'k', profileFile: '/etc/nbx.json', profile: 'staging' });
    expect(() => loadConfig({ NESTBOX_PROFILE: '../x' })).toThrow(/NESTBOX_PROFILE/);
  });

  it('refuses a misspelt NESTBOX_ variable but ignores the test suite’s own', () => {
    expect(() => loadConfig({ NESTBOX_PROT: '1' })).toThrow(/NESTBOX_PROT: unknown setting/);
    expect(() => loadConfig({ NESTBOX_TEST_IMAGES_DIR: '/x' })).not.toThrow();
  });
});

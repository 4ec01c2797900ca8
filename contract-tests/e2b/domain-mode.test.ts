// E2B SDKs configured the way E2B's own cloud is used: only a domain (`domain` / E2B_DOMAIN) and
// a key, no apiUrl or sandboxUrl. The SDK then calls https://api.<domain> for its control plane
// and https://49983-<id>.<domain> for envd, which is how a Nestbox behind TLS and wildcard DNS
// (NESTBOX_PUBLIC_DOMAIN, docs/deployment.md) is reached, and the only way e2b < 2.7 reaches envd
// at all. Here a TLS terminator in the test process stands for the load balancer (a certificate
// for *.<domain> made with openssl, passed through to Nestbox's plain HTTP port), and the names
// resolve to loopback through a lookup hook in this process: no DNS, no outside traffic.
import dns from 'node:dns';
import net from 'node:net';
import tls from 'node:tls';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Sandbox } from 'e2b';
import { Sandbox as LegacySandbox } from 'e2b-legacy';
import { startTestServer, type TestServer } from '../../test/harness.js';

const NAME = 'sandboxes.nbx.test';
let t: TestServer;
let terminator: tls.Server;
let domain: string;
const certDir = mkdtempSync('/tmp/nbx-tls-');
const originalLookup = dns.lookup;
const savedEnv: Record<string, string | undefined> = {};

/** *.<NAME> → 127.0.0.1; everything else as before. */
function hookLookup(): void {
  const hooked = ((hostname: string, options: unknown, callback?: unknown) => {
    const cb = (typeof options === 'function' ? options : callback) as (...args: unknown[]) => void;
    const opts = (typeof options === 'object' && options !== null ? options : {}) as { all?: boolean };
    if (hostname === NAME || hostname.endsWith(`.${NAME}`)) {
      return process.nextTick(() => (opts.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4)));
    }
    return (originalLookup as (...args: unknown[]) => void)(hostname, options, callback);
  }) as typeof dns.lookup;
  dns.lookup = hooked;
}

beforeAll(async () => {
  // A self-signed certificate for the wildcard and the API name, as a load balancer would hold.
  execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', `/CN=${NAME}`, '-addext', `subjectAltName=DNS:${NAME},DNS:*.${NAME}`, '-keyout', join(certDir, 'key.pem'), '-out', join(certDir, 'cert.pem')], { stdio: 'ignore' });
  let upstreamPort = 0;
  terminator = tls.createServer({ key: readFileSync(join(certDir, 'key.pem')), cert: readFileSync(join(certDir, 'cert.pem')), ALPNProtocols: ['http/1.1'] }, (client) => {
    const upstream = net.connect(upstreamPort, '127.0.0.1');
    client.pipe(upstream).pipe(client);
    const close = () => { client.destroy(); upstream.destroy(); };
    client.on('error', close);
    upstream.on('error', close);
  });
  await new Promise<void>((resolve) => terminator.listen(0, '127.0.0.1', resolve));
  const tlsPort = (terminator.address() as net.AddressInfo).port;
  // The public port is part of the domain, so every name the SDK builds carries it.
  domain = `${NAME}:${tlsPort}`;
  t = await startTestServer({ env: { NESTBOX_PUBLIC_DOMAIN: domain, NESTBOX_PUBLIC_SCHEME: 'https' } });
  upstreamPort = Number(new URL(t.url).port);

  hookLookup();
  // This worker trusts the test certificate (the SDK's own undici agent uses Node's TLS
  // defaults, so there is no CA option to hand it), and no E2B_* setting may steer the SDK.
  for (const k of ['NODE_TLS_REJECT_UNAUTHORIZED', ...Object.keys(process.env).filter((k) => k.startsWith('E2B_'))]) savedEnv[k] = process.env[k];
  for (const k of Object.keys(savedEnv)) delete process.env[k];
  process.env.NODE_TLS_REJECT_UNAUTHORIZED = '0';
});

afterAll(async () => {
  dns.lookup = originalLookup;
  for (const [k, v] of Object.entries(savedEnv)) if (v === undefined) delete process.env[k]; else process.env[k] = v;
  await t?.close();
  await new Promise((resolve) => terminator?.close(resolve));
  rmSync(certDir, { recursive: true, force: true });
});

describe('e2b SDKs given only a domain', () => {
  it('e2b 2.51: create, commands, files and getHost through api.<domain> and 49983-<id>.<domain>', async () => {
    const sbx = await Sandbox.create({ apiKey: t.apiKey, domain, timeoutMs: 120_000, allowInternetAccess: false });
    try {
      expect(sbx.getHost(3000)).toBe(`3000-${sbx.sandboxId}.${domain}`);
      const run = await sbx.commands.run('echo domain-mode $((6 * 7))');
      expect(run.stdout.trim()).toBe('domain-mode 42');
      await sbx.files.write('/tmp/through-tls.txt', 'over the wildcard name');
      expect(await sbx.files.read('/tmp/through-tls.txt')).toBe('over the wildcard name');
      expect((await Sandbox.list({ apiKey: t.apiKey, domain }).nextItems()).map((s) => s.sandboxId)).toContain(sbx.sandboxId);
    } finally {
      await sbx.kill();
    }
    expect((await Sandbox.getInfo(sbx.sandboxId, { apiKey: t.apiKey, domain }).catch((err: Error) => err)).constructor.name).toMatch(/NotFound/);
  });

  it('e2b 2.6 (no sandboxUrl option at all): its envd traffic reaches the sandbox by host name', async () => {
    const sbx = await LegacySandbox.create({ apiKey: t.apiKey, domain, timeoutMs: 120_000 });
    try {
      const run = await sbx.commands.run('cat /etc/hostname; id -un');
      expect(run.exitCode).toBe(0);
      expect(run.stdout.trim().split('\n')).toHaveLength(2);
      await sbx.files.write('/tmp/legacy.txt', 'legacy over TLS');
      expect(await sbx.files.read('/tmp/legacy.txt')).toBe('legacy over TLS');
    } finally {
      await sbx.kill();
    }
  });
});

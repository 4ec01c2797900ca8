// A test "internet" for egress tests: a network namespace of the test's own behind a veth, with
// an address on the link and more addresses in a second range routed to it, each answering HTTP
// on one port. Sandboxes reach it through their slot like any outside host, and nothing leaves
// the machine. Addresses come from RFC 2544's benchmarking range (198.18.0.0/15), which neither
// the isolation rules block nor any real network uses; each caller picks its own /24s.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** Connects from wherever it runs: ok (an answer), refused (reached, nothing listens), timeout (dropped). */
export const TCP_PROBE = String.raw`
import socket, sys
s = socket.socket(); s.settimeout(3)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    s.sendall(b'GET / HTTP/1.0\r\nHost: probe\r\n\r\n')
    print('ok' if s.recv(200) else 'empty')
except socket.timeout: print('timeout')
except ConnectionRefusedError: print('refused')
except OSError as e: print('error', e.errno)
`;

export interface TestInternetOptions {
  /** `198.18.<n>.0/24` holds the link (host side .1, the namespace .2). */
  linkNet: number;
  /** `198.18.<n>.0/24` is routed to the namespace; `hosts` of it live there (e.g. [10, 20]). */
  routedNet: number;
  hosts: number[];
  port: number;
}

export interface TestInternet {
  /** The namespace's address on the link. */
  linkAddress: string;
  /** The routed range and its addresses, in the order of `hosts`. */
  routedRange: string;
  routed: string[];
  port: number;
  close(): void;
}

const ip = (...args: string[]) => execFileSync('ip', args, { stdio: ['ignore', 'pipe', 'pipe'] });
const quietly = (fn: () => unknown) => {
  try {
    fn();
  } catch {
    // already gone
  }
};

/** Builds it and waits (bounded) until the host gets an answer from every address. */
export async function createTestInternet(options: TestInternetOptions): Promise<TestInternet> {
  const suffix = randomBytes(3).toString('hex');
  const netns = `nbxti-${suffix}`;
  const link = `nbxti${suffix}`;
  const linkAddress = `198.18.${options.linkNet}.2`;
  const routedRange = `198.18.${options.routedNet}.0/24`;
  const routed = options.hosts.map((host) => `198.18.${options.routedNet}.${host}`);
  const dir = mkdtempSync('/tmp/nbx-test-internet-');
  writeFileSync(join(dir, 'index.html'), 'the test internet says hi\n');
  let server: ChildProcess | undefined;
  const close = () => {
    server?.kill('SIGKILL');
    quietly(() => ip('route', 'del', routedRange));
    quietly(() => ip('link', 'del', link));
    quietly(() => ip('netns', 'del', netns));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    ip('netns', 'add', netns);
    ip('link', 'add', link, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', netns);
    ip('addr', 'add', `198.18.${options.linkNet}.1/24`, 'dev', link);
    ip('link', 'set', link, 'up');
    ip('-n', netns, 'addr', 'add', `${linkAddress}/24`, 'dev', 'eth0');
    for (const address of routed) ip('-n', netns, 'addr', 'add', `${address}/32`, 'dev', 'lo');
    ip('-n', netns, 'link', 'set', 'eth0', 'up');
    ip('-n', netns, 'link', 'set', 'lo', 'up');
    ip('route', 'add', routedRange, 'via', linkAddress, 'dev', link);
    server = spawn('ip', ['netns', 'exec', netns, 'python3', '-m', 'http.server', String(options.port), '--bind', '0.0.0.0', '--directory', dir], { stdio: 'ignore' });
    const deadline = Date.now() + 20_000;
    for (const address of [linkAddress, ...routed]) {
      while (execFileSync('python3', ['-c', TCP_PROBE, address, String(options.port)], { encoding: 'utf8' }).trim() !== 'ok') {
        if (Date.now() > deadline) throw new Error(`the test internet did not answer on ${address}`);
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
  } catch (error) {
    close();
    throw error;
  }
  return { linkAddress, routedRange, routed, port: options.port, close };
}

// The SSH gateway (issue 19): an ssh2 server the worker starts on NESTBOX_SSH_PORT. It is a
// front door like the HTTP APIs: it authenticates a connection to a principal
// (core/services/ssh-access.ts) and then does everything through core's services: the sandbox
// is woken through SandboxService, commands and shells are toolbox processes (a PTY one is
// attached over the same terminal WebSocket the native API relays), files go through the
// toolbox's file operations (sftp.ts), and forwarded ports through the toolbox's TCP channel.
//
// Who may log in:
//   - username = an SSH access token (createSshAccess), with no further credential (the `none`
//     method, as Daytona's gateway does), or with any publickey offered;
//   - username = a sandbox id, with a public key registered for the sandbox's organisation.
// Failed logins are limited per client address (NESTBOX_SSH_MAX_AUTH_FAILURES_PER_MINUTE).
import net from 'node:net';
import ssh2 from 'ssh2';
import type { AuthContext, Connection, ServerChannel, Session, PseudoTtyInfo } from 'ssh2';
import { WebSocket } from 'ws';
import type { Logger } from '../../core/logger.js';
import { NestboxError, toNestboxError } from '../../core/errors.js';
import type { ProcessSignal } from '../../core/guest.js';
import type { SshIdentity } from '../../core/services/ssh-access.js';
import { SSH_TOKEN_PATTERN } from '../../core/services/ssh-access.js';
import type { Services } from '../services.js';
import { gatewayHostKey } from './host-key.js';
import { serveSftp } from './sftp.js';

const { Server, utils } = ssh2;

export interface SshGateway {
  port: number;
  close(): Promise<void>;
}

type GatewayServices = Pick<Services, 'sshAccess' | 'sandboxes' | 'toolbox' | 'hostSecret'> & { config: { ssh: Services['config']['ssh'] } };

const SIGNALS = new Set(['TERM', 'INT', 'KILL', 'HUP', 'QUIT', 'USR1', 'USR2', 'STOP', 'CONT']);
/** Channels (sessions and forwards) one connection may hold at once. */
const MAX_CHANNELS_PER_CONNECTION = 32;
/** A connection that has not authenticated by then is closed (OpenSSH's LoginGraceTime is 120 s). */
const LOGIN_GRACE_MS = 60_000;
/** Environment names a client may set (as sshd's AcceptEnv would). */
const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,63}$/;

/** Failed logins per client address in a sliding minute. */
class AuthFailures {
  private readonly byAddress = new Map<string, number[]>();
  constructor(private readonly perMinute: number) {}
  private recent(address: string): number[] {
    const cutoff = Date.now() - 60_000;
    const list = (this.byAddress.get(address) ?? []).filter((t) => t > cutoff);
    if (list.length) this.byAddress.set(address, list);
    else this.byAddress.delete(address);
    return list;
  }
  blocked(address: string): boolean {
    return this.recent(address).length >= this.perMinute;
  }
  note(address: string): void {
    const list = this.recent(address);
    list.push(Date.now());
    this.byAddress.set(address, list);
    // Bound the table itself: forget the oldest addresses beyond 10 000.
    if (this.byAddress.size > 10_000) this.byAddress.delete(this.byAddress.keys().next().value!);
  }
}

export async function startSshGateway(services: GatewayServices, logger: Logger): Promise<SshGateway> {
  const cfg = services.config.ssh;
  const log = logger.child({ component: 'ssh' });
  const failures = new AuthFailures(cfg.maxAuthFailuresPerMinute);
  const open = new Set<Connection>();
  const server = new Server({ hostKeys: [gatewayHostKey(services.hostSecret, cfg.hostKeyFile)], ident: 'nestbox' }, (client, info) => {
    const address = info.ip;
    if (open.size >= cfg.maxConnections) {
      log.warn({ address }, 'refused an SSH connection: too many open connections');
      client.end();
      return;
    }
    open.add(client);
    // Interactive traffic: small packets go out at once (as sshd does), not after a delayed ACK.
    (client as unknown as { setNoDelay(on: boolean): void }).setNoDelay(true);
    client.on('close', () => open.delete(client));
    client.on('error', (err) => log.debug({ address, err: err.message }, 'SSH connection error'));
    const grace = setTimeout(() => client.end(), LOGIN_GRACE_MS);
    let identity: SshIdentity | undefined;
    client.on('authentication', (ctx) => {
      if (failures.blocked(address)) {
        log.warn({ address }, 'refused an SSH login: too many failed attempts from this address');
        ctx.reject([]);
        client.end();
        return;
      }
      authenticate(services, ctx)
        .then((who) => {
          if (who === 'query-accepted') return; // the client asked whether a key would do
          if (!who) {
            if (ctx.method !== 'none') failures.note(address);
            ctx.reject(['publickey']);
            return;
          }
          identity = who;
          ctx.accept();
        })
        .catch((err: unknown) => {
          failures.note(address);
          // Never the username: it may be a token.
          log.info({ address, method: ctx.method, reason: toNestboxError(err).message }, 'refused an SSH login');
          ctx.reject(['publickey']);
        });
    });
    client.on('ready', () => {
      clearTimeout(grace);
      const who = identity!;
      log.info({ address, sandboxId: who.sandboxId, method: who.method }, 'SSH login');
      const stopActivity = services.toolbox.keepActive(who.sandboxId);
      client.once('close', stopActivity);
      // The sandbox is woken once per connection; every channel waits for it.
      const ready = wake(services, who);
      ready.catch((err: unknown) => log.info({ sandboxId: who.sandboxId, reason: toNestboxError(err).message }, 'SSH: sandbox could not be woken'));
      let channels = 0;
      const admit = (): boolean => {
        if (channels >= MAX_CHANNELS_PER_CONNECTION) return false;
        channels++;
        return true;
      };
      const release = () => channels--;
      client.on('session', (accept, reject) => {
        if (!admit()) return reject();
        const session = accept();
        session.once('close', release);
        handleSession(services, who, session, ready, log);
      });
      client.on('tcpip', (accept, reject, info) => {
        if (!admit()) return reject();
        ready
          .then(() => services.toolbox.connectTcp(who.principal, who.sandboxId, { host: info.destIP, port: info.destPort }))
          .then((target) => {
            const ws = new WebSocket(target.url, { headers: target.headers, handshakeTimeout: 15_000 });
            ws.once('unexpected-response', () => {
              release();
              reject();
            });
            ws.once('error', () => undefined);
            ws.once('open', () => {
              const channel = accept();
              channel.once('close', release);
              pipeWebSocket(ws, channel);
            });
          })
          .catch((err: unknown) => {
            release();
            log.info({ sandboxId: who.sandboxId, port: info.destPort, reason: toNestboxError(err).message }, 'SSH: port forward refused');
            reject();
          });
      });
      client.on('request', (accept, reject, name) => {
        // Remote forwarding (-R) and other global requests are not offered.
        reject?.();
        void accept;
        void name;
      });
    });
  });
  server.on('error', (err: Error) => log.error({ err: err.message }, 'SSH gateway error'));
  const port = await new Promise<number>((resolve, reject) => {
    server.once('error', reject);
    server.listen(cfg.port, cfg.listenHost, () => {
      server.off('error', reject);
      resolve((server.address() as net.AddressInfo).port);
    });
  });
  log.info({ port, host: cfg.listenHost }, 'SSH gateway listening');
  return {
    port,
    close: () =>
      new Promise<void>((resolve) => {
        for (const c of open) c.end();
        server.close(() => resolve());
      }),
  };
}

async function authenticate(services: GatewayServices, ctx: AuthContext): Promise<SshIdentity | 'query-accepted' | undefined> {
  const username = ctx.username;
  if (SSH_TOKEN_PATTERN.test(username)) {
    // A token is the whole credential: `none` (what OpenSSH tries first) or any method.
    if (ctx.method === 'none' || ctx.method === 'publickey' || ctx.method === 'password' || ctx.method === 'keyboard-interactive') {
      return services.sshAccess.authenticateToken(username);
    }
    return undefined;
  }
  if (ctx.method !== 'publickey') return undefined;
  const found = await services.sshAccess.keyForSandbox(username, ctx.key.data);
  if (!found) return undefined;
  if (!ctx.signature || !ctx.blob) {
    // The client only asks whether this key would be accepted; it signs next.
    ctx.accept();
    return 'query-accepted';
  }
  const parsed = utils.parseKey(found.publicKey);
  const key = Array.isArray(parsed) ? parsed[0] : parsed;
  if (!key || key instanceof Error) return undefined;
  return key.verify(ctx.blob, ctx.signature, ctx.hashAlgo) === true ? found.identity : undefined;
}

/** A stopped sandbox is started and a paused one resumed (as the native API's resume does). */
async function wake(services: GatewayServices, who: SshIdentity): Promise<void> {
  const sandbox = await services.sandboxes.get(who.principal, who.sandboxId);
  if (sandbox.state === 'stopped' || sandbox.state === 'paused') await services.sandboxes.resume(who.principal, who.sandboxId);
}

function failChannel(channel: ServerChannel, err: unknown): void {
  const e = toNestboxError(err);
  try {
    channel.stderr.write(`nestbox: ${e.message}\r\n`);
    channel.exit(255);
    channel.end();
  } catch {
    /* the client has gone */
  }
}

function handleSession(services: GatewayServices, who: SshIdentity, session: Session, ready: Promise<void>, log: Logger): void {
  let pty: PseudoTtyInfo | undefined;
  const env: Record<string, string> = {};
  let processId: string | undefined;
  const pendingSizes: { cols: number; rows: number }[] = [];
  const { principal, sandboxId } = who;

  session.on('pty', (accept, _reject, info) => {
    pty = info;
    accept?.();
  });
  session.on('env', (accept, reject, info) => {
    if (ENV_NAME.test(info.key) && info.val.length <= 4096 && Object.keys(env).length < 64) {
      env[info.key] = info.val;
      accept?.();
    } else reject?.();
  });
  session.on('window-change', (accept, _reject, info) => {
    accept?.();
    const size = { cols: Math.max(1, Math.min(info.cols, 1000)), rows: Math.max(1, Math.min(info.rows, 1000)) };
    if (!processId) pendingSizes.push(size);
    else void services.toolbox.resizeTerminal(principal, sandboxId, processId, size).catch(() => undefined);
  });
  session.on('signal', (accept, _reject, info) => {
    accept?.();
    if (!processId || !SIGNALS.has(info.name)) return;
    void services.toolbox.signalProcess(principal, sandboxId, processId, `SIG${info.name}` as ProcessSignal).catch(() => undefined);
  });

  const run = (channel: ServerChannel, command: string | undefined): void => {
    const terminal = pty;
    const startEnv = { ...env, ...(terminal?.term ? { TERM: terminal.term } : {}) };
    // A login shell for `shell`; `sh -c` for a command, as sshd runs the user's shell with -c.
    const argv = command === undefined ? ['/bin/bash', '-l'] : ['/bin/sh', '-c', command];
    ready
      .then(() =>
        services.toolbox.startProcess(principal, sandboxId, {
          argv,
          env: startEnv,
          stdin: true,
          tag: 'ssh',
          ...(terminal ? { pty: { cols: Math.max(1, Math.min(terminal.cols || 80, 1000)), rows: Math.max(1, Math.min(terminal.rows || 24, 1000)) } } : {}),
        }),
      )
      .then(async (proc) => {
        processId = proc.processId;
        for (const size of pendingSizes.splice(0)) await services.toolbox.resizeTerminal(principal, sandboxId, proc.processId, size).catch(() => undefined);
        if (terminal) await relayTerminal(services, who, proc.processId, channel);
        else await relayProcess(services, who, proc.processId, channel);
      })
      .catch((err: unknown) => {
        log.info({ sandboxId, reason: toNestboxError(err).message }, 'SSH: session failed');
        failChannel(channel, err);
      });
  };
  session.on('shell', (accept) => run(accept(), undefined));
  session.on('exec', (accept, _reject, info) => run(accept(), info.command));
  session.on('sftp', (accept) => {
    const sftp = accept();
    ready.then(
      () => serveSftp(services.toolbox, principal, sandboxId, sftp, log),
      (err: unknown) => {
        log.info({ sandboxId, reason: toNestboxError(err).message }, 'SSH: sftp refused');
        sftp.end();
      },
    );
  });
}

/** Tell the client how the process ended: exit-status, or exit-signal for a signal. */
function sendExit(channel: ServerChannel, exitCode: number | null, signal: string | null): void {
  try {
    if (exitCode !== null) channel.exit(exitCode);
    else if (signal) channel.exit(signal.replace(/^SIG/, ''), false, '');
    else channel.exit(255);
    channel.end();
  } catch {
    /* the client has gone */
  }
}

/**
 * A process without a terminal: output from the toolbox's event stream (stdout and stderr kept
 * apart, with the channel's backpressure), input through the stdin writes in order, EOF closing
 * stdin. The client hanging up kills the process.
 */
async function relayProcess(services: GatewayServices, who: SshIdentity, processId: string, channel: ServerChannel): Promise<void> {
  const { principal, sandboxId } = who;
  const reading = new AbortController();
  let ended = false;
  // Stdin: chunks written one request at a time, what arrives meanwhile joined into the next.
  let queued: Buffer[] = [];
  let writing: Promise<void> | undefined;
  let eof = false;
  const flush = (): Promise<void> => {
    if (writing) return writing;
    writing = (async () => {
      while (queued.length) {
        const chunk = Buffer.concat(queued);
        queued = [];
        await services.toolbox.writeStdin(principal, sandboxId, processId, chunk).catch(() => undefined);
      }
      writing = undefined;
      if (eof && !ended) await services.toolbox.closeStdin(principal, sandboxId, processId).catch(() => undefined);
    })();
    return writing;
  };
  channel.on('data', (chunk: Buffer) => {
    queued.push(chunk);
    // Hold the client back while a large backlog waits.
    if (queued.reduce((n, b) => n + b.length, 0) > 1024 * 1024) channel.pause();
    void flush().then(() => channel.resume());
  });
  channel.on('end', () => {
    eof = true;
    void flush();
  });
  channel.once('close', () => {
    reading.abort();
    if (!ended) void services.toolbox.killProcess(principal, sandboxId, processId).catch(() => undefined);
  });
  const stream = await services.toolbox.processEvents(principal, sandboxId, processId, { offset: 0 }, { signal: reading.signal });
  try {
    for await (const event of stream.events()) {
      if (event.type === 'stdout' || event.type === 'stderr') {
        const target = event.type === 'stdout' ? channel : channel.stderr;
        if (!target.write(Buffer.from(event.data, 'base64'))) await new Promise<void>((r) => channel.once('drain', r).once('close', r));
      } else if (event.type === 'exit') {
        ended = true;
        sendExit(channel, event.exitCode, event.signal);
        return;
      }
    }
  } catch (err) {
    if (reading.signal.aborted) return;
    throw err;
  }
  // The stream ended without an exit event: ask the process how it ended.
  const info = await services.toolbox.getProcess(principal, sandboxId, processId);
  ended = info.status !== 'running';
  sendExit(channel, info.exitCode, info.signal);
}

/** A process on a terminal: raw bytes both ways over the terminal WebSocket. */
async function relayTerminal(services: GatewayServices, who: SshIdentity, processId: string, channel: ServerChannel): Promise<void> {
  const { principal, sandboxId } = who;
  const target = await services.toolbox.attachTerminal(principal, sandboxId, processId);
  const ws = new WebSocket(target.url, { headers: target.headers, handshakeTimeout: 15_000 });
  let exit: { exitCode: number | null; signal: string | null } | undefined;
  await new Promise<void>((resolve, reject) => {
    ws.once('open', () => resolve());
    ws.once('unexpected-response', (_req, res) => reject(new NestboxError('host_unavailable', `the terminal could not be attached (${res.statusCode})`)));
    ws.once('error', reject);
  });
  ws.on('message', (data: Buffer, isBinary: boolean) => {
    if (isBinary) {
      if (!channel.write(data)) {
        ws.pause();
        channel.once('drain', () => ws.resume());
      }
      return;
    }
    try {
      const message = JSON.parse(data.toString('utf8')) as { type?: string; exitCode?: number | null; signal?: string | null };
      if (message.type === 'exit') exit = { exitCode: message.exitCode ?? null, signal: message.signal ?? null };
    } catch {
      /* not ours to read */
    }
  });
  channel.on('data', (chunk: Buffer) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(chunk, { binary: true });
  });
  channel.once('close', () => {
    if (!exit) void services.toolbox.killProcess(principal, sandboxId, processId).catch(() => undefined);
    ws.close();
  });
  await new Promise<void>((resolve) => ws.once('close', () => resolve()));
  if (!exit) {
    const info = await services.toolbox.getProcess(principal, sandboxId, processId).catch(() => undefined);
    exit = { exitCode: info?.exitCode ?? null, signal: info?.signal ?? null };
  }
  sendExit(channel, exit.exitCode, exit.signal);
}

/** A forwarded TCP connection: the WebSocket's binary frames are the connection's bytes. */
function pipeWebSocket(ws: WebSocket, channel: ServerChannel): void {
  ws.on('message', (data: Buffer) => {
    if (!channel.write(data)) {
      ws.pause();
      channel.once('drain', () => ws.resume());
    }
  });
  channel.on('data', (chunk: Buffer) => {
    if (ws.readyState === WebSocket.OPEN) ws.send(chunk, { binary: true });
  });
  // The client's EOF ends our side; the far side's close ends the channel.
  channel.on('end', () => ws.close(1000));
  ws.once('close', () => {
    try {
      channel.end();
    } catch {
      /* gone */
    }
  });
  channel.once('close', () => ws.terminate());
}

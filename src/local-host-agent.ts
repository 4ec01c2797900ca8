// The server's own host agent, run as a child process: a real process boundary and the same
// HTTP protocol as a remote host, so single-machine mode exercises the production path.
import { spawn, type ChildProcess } from 'node:child_process';
import { rmSync, writeFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { join } from 'node:path';
import type { Logger } from '../core/logger.js';
import { relayChildLine } from './logger.js';
import type { Config } from './config.js';
import { CLI_ENTRY } from './paths.js';
import { hostAgentPidFile } from './supervisor.js';

export interface SupervisorOptions {
  config: Config;
  controlPlaneUrl: string;
  secret: string;
  /** The server's logger: the host agent's own records are passed on with their fields. */
  logger: Logger;
}

export class LocalHostAgentSupervisor {
  private child: ChildProcess | undefined;
  private stopping = false;
  private restarts = 0;
  private restartTimer: NodeJS.Timeout | undefined;
  /** Lines about the child, and whatever it writes that is not a log record. */
  private readonly log: Logger;

  constructor(private readonly opts: SupervisorOptions) {
    this.log = opts.logger.child({ component: 'local-host-agent' });
  }

  start(): void {
    const { config } = this.opts;
    // Only the settings a host agent reads are passed; the rest of the environment is not.
    const env: NodeJS.ProcessEnv = {
      PATH: process.env.PATH,
      HOME: process.env.HOME,
      NESTBOX_DATA_DIR: join(config.dataDir, 'host'),
      NESTBOX_IMAGES_DIR: config.imagesDir,
      NESTBOX_HOST_ID: config.hostAgent.hostId,
      NESTBOX_HOST_AGENT_HOST: '127.0.0.1',
      NESTBOX_HOST_AGENT_PORT: '0',
      NESTBOX_CONTROL_PLANE_URL: this.opts.controlPlaneUrl,
      NESTBOX_HOST_AGENT_SECRET: this.opts.secret,
      NESTBOX_HEARTBEAT_INTERVAL_MS: String(config.hostAgent.heartbeatIntervalMs),
      NESTBOX_SANDBOX_SUBNET: config.hostAgent.subnet,
      NESTBOX_REFLINK_STORE: config.hostAgent.reflinkStore,
      NESTBOX_REFLINK_STORE_GIB: String(config.hostAgent.reflinkStoreGiB),
      NESTBOX_SLOT_POOL_SIZE: String(config.hostAgent.slotPoolSize),
      NESTBOX_USERNS_BASE: String(config.hostAgent.userNamespaceBase),
      NESTBOX_USERNS_MAX: String(config.hostAgent.maxUserNamespaces),
      NESTBOX_EGRESS_REFRESH_SECONDS: String(config.hostAgent.egressRefreshSeconds),
      NESTBOX_USAGE_SAMPLE_SECONDS: String(config.usage.sampleSeconds),
      NESTBOX_EXIT_WITH_PARENT: 'true',
      NESTBOX_LOG_LEVEL: config.logLevel,
      // What it reports to placement: the same labels and capacity overrides as the server was given.
      ...(Object.keys(config.hostAgent.labels).length ? { NESTBOX_HOST_LABELS: Object.entries(config.hostAgent.labels).map(([k, v]) => `${k}=${v}`).join(',') } : {}),
      ...(config.hostAgent.capacityOverride.cpu ? { NESTBOX_HOST_CAPACITY_CPU: String(config.hostAgent.capacityOverride.cpu) } : {}),
      ...(config.hostAgent.capacityOverride.memoryMiB ? { NESTBOX_HOST_CAPACITY_MEMORY_MIB: String(config.hostAgent.capacityOverride.memoryMiB) } : {}),
      ...(config.hostAgent.capacityOverride.diskGiB ? { NESTBOX_HOST_CAPACITY_DISK_GIB: String(config.hostAgent.capacityOverride.diskGiB) } : {}),
      // Its /metrics answers the same token as the server's.
      ...(config.metrics.token ? { NESTBOX_METRICS_TOKEN: config.metrics.token } : {}),
      // The host agent traces to the same collector (and passes on its guest agents' spans).
      ...(config.tracing.otlpEndpoint ? { NESTBOX_OTLP_ENDPOINT: config.tracing.otlpEndpoint, NESTBOX_TRACE_SAMPLE_RATIO: String(config.tracing.sampleRatio) } : {}),
    };
    const child = spawn(process.execPath, [CLI_ENTRY(), 'host-agent'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    this.child = child;
    // The server's supervisor waits for this pid to be gone before it starts a new worker, so
    // two host agents never run on one data dir (src/supervisor.ts).
    if (child.pid) writeFileSync(hostAgentPidFile(config), `${child.pid}\n`);
    createInterface({ input: child.stdout! }).on('line', (line) => relayChildLine(this.opts.logger, line, (text) => this.log.info(`[host-agent] ${text}`)));
    createInterface({ input: child.stderr! }).on('line', (line) => relayChildLine(this.opts.logger, line, (text) => this.log.warn(`[host-agent] ${text}`)));
    child.on('exit', (code, signal) => {
      this.child = undefined;
      rmSync(hostAgentPidFile(config), { force: true });
      if (this.stopping) return;
      // Back off so a host agent that cannot start (e.g. missing tools) does not spin.
      const delay = Math.min(30_000, 1000 * 2 ** Math.min(this.restarts++, 5));
      this.log.error({ childPid: child.pid }, `host agent exited (${signal ?? code}); restarting in ${delay} ms`);
      this.restartTimer = setTimeout(() => this.start(), delay);
    });
  }

  async stop(): Promise<void> {
    this.stopping = true;
    if (this.restartTimer) clearTimeout(this.restartTimer);
    const child = this.child;
    if (!child) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  }
}

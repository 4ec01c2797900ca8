// `nestbox host-agent`: owns this machine's sandboxes, serves the control plane, heartbeats.
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, statfsSync } from 'node:fs';
import { availableParallelism, totalmem } from 'node:os';
import type { Config } from './config.js';
import { ConfigError } from './config.js';
import { HostAgentServer } from '../host/agent/server.js';
import { HostAgentMetrics, meterDriver } from '../host/agent/metrics.js';
import { LocalDriver } from '../host/drivers/local/driver.js';
import type { Driver } from '../host/drivers/types.js';
import { ensureBaseImage } from '../host/images/base-image.js';
import { ensureCodeInterpreterImage } from '../host/images/code-interpreter-image.js';
import { HEARTBEAT_PATH, MAX_HEARTBEAT_USAGE_SAMPLES, type Heartbeat } from '../host/protocol/schemas.js';
import { UsageSampler } from '../host/agent/usage-sampler.js';
import { GUEST_AGENT_BUNDLE, projectPath } from './paths.js';
import type { Logger } from '../core/logger.js';
import { createLogger } from './logger.js';
import { raiseOpenFileLimit } from './fd-limit.js';
import { startTracing } from './tracing.js';

export interface RunningHostAgent {
  url: string;
  close(): Promise<void>;
}

/** `logger` defaults to JSON lines on stdout at NESTBOX_LOG_LEVEL, each with `component` and `hostId`. */
export async function startHostAgent(config: Config, logger?: Logger): Promise<RunningHostAgent> {
  const ha = config.hostAgent;
  const log = logger ?? createLogger({ level: config.logLevel, base: { component: 'host-agent', hostId: ha.hostId } });
  if (!ha.secret) throw new ConfigError('invalid configuration:\n  NESTBOX_HOST_AGENT_SECRET: required for a host agent');
  if (!ha.controlPlaneUrl) throw new ConfigError('invalid configuration:\n  NESTBOX_CONTROL_PLANE_URL: required for a host agent');
  raiseOpenFileLimit(log);
  mkdirSync(config.dataDir, { recursive: true, mode: 0o700 });
  const tracing = startTracing(config.tracing, 'nestbox-host-agent', log, { 'nestbox.host.id': ha.hostId });

  // Build (or reuse) the base image before registering, so the first create is not the one
  // that waits for debootstrap.
  if (ha.driver === 'local') await ensureBaseImage({ imagesDir: config.imagesDir, name: 'default', onProgress: (line) => log.info(`image: ${line}`) });
  // The code-interpreter image is derived from it and takes minutes (apt): built in the
  // background, so the agent serves `default` sandboxes meanwhile; a create that asks for it
  // before it is ready waits for this same build (the build lock), it never starts a second one.
  if (ha.driver === 'local' && ha.codeInterpreterImage === 'background') {
    void ensureCodeInterpreterImage({ imagesDir: config.imagesDir, onProgress: (line) => log.info(`image: ${line}`), onOutput: (line) => log.debug(`image: ${line}`) }).catch((err: unknown) =>
      log.error({ err: err instanceof Error ? err.message : String(err) }, 'image: the code-interpreter image could not be built; sandboxes asking for it will try again'),
    );
  }

  const driver: Driver =
    ha.driver === 'cloud-hypervisor'
      ? await createCloudHypervisorDriver(config, log)
      : new LocalDriver({
        dataDir: config.dataDir,
        imagesDir: config.imagesDir,
        ociStoreDir: config.images.ociStoreDir,
        guestAgentBundle: GUEST_AGENT_BUNDLE(),
        subnet: ha.subnet,
        // Several host agents can share a machine (tests do); each reclaims only what it owns.
        ownerId: `${ha.hostId}-${createHash('sha256').update(config.dataDir).digest('hex').slice(0, 12)}`,
        // Copy-on-write forks and snapshots: a loop-mounted XFS in the data dir when asked for and
        // the data dir itself cannot reflink (the driver probes first).
        reflinkStore: ha.reflinkStore === 'auto' ? { imagePath: `${config.dataDir}/store.xfs`, sizeBytes: ha.reflinkStoreGiB * 1024 ** 3 } : 'off',
        slotPoolSize: ha.slotPoolSize,
        egressRefreshMs: ha.egressRefreshSeconds * 1000,
        userNamespaceBase: ha.userNamespaceBase,
        maxUserNamespaces: ha.maxUserNamespaces,
        logger: log,
      });
  await driver.init();

  // The series are served at /metrics with NESTBOX_METRICS_TOKEN; without one, driver calls
  // are not timed (no wrapper) and requests not measured.
  const metricsToken = config.metrics.token;
  const metrics = new HostAgentMetrics(driver, metricsToken !== undefined);
  const server = new HostAgentServer({
    hostId: ha.hostId,
    secret: ha.secret,
    driver: metricsToken ? meterDriver(driver, metrics) : driver,
    logger: log,
    ...(metricsToken ? { metrics: { series: metrics, token: metricsToken } } : {}),
    // Guest agents' spans come out through this host agent (host/agent/guest-spans.ts).
    guestSpans: tracing ? (otlpJson, sandboxId) => tracing.forwardGuestSpans(otlpJson, { sandboxId, hostId: ha.hostId }) : undefined,
  });
  const port = await server.listen(ha.listenPort, ha.listenHost);
  const url = ha.advertisedUrl ?? `http://${ha.listenHost}:${port}`;
  log.info({ url }, `host agent ${ha.hostId} (${driver.name} driver) listening on ${url}`);

  // Per-sandbox usage rides on the heartbeats: each carries what was sampled since the last one
  // the control plane answered (a failed beat puts its samples back).
  const sampler = new UsageSampler(driver, { intervalMs: config.usage.sampleSeconds * 1000, logger: log });
  sampler.start();

  let stopped = false;
  const version = releaseVersion();
  const heartbeat = async () => {
    const usage = sampler.take(MAX_HEARTBEAT_USAGE_SAMPLES);
    const runtimes = await driver.list();
    const body: Heartbeat = {
      hostId: ha.hostId,
      url,
      driver: driver.name,
      // The machine's memory beside the driver's facts: the control plane's host capacity gauge.
      capabilities: { ...driver.capabilities(), memoryBytes: totalmem() },
      sandboxes: runtimes.map((s) => ({ id: s.id, status: s.status })),
      ...(usage.length ? { usage } : {}),
      capacity: hostCapacity(config),
      labels: ha.labels,
      version,
      allocated: await allocationOf(driver, runtimes.length),
    };
    try {
      const res = await fetch(new URL(HEARTBEAT_PATH, ha.controlPlaneUrl), {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${ha.secret}` },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(10_000),
      });
      if (!res.ok) {
        // A 400 refuses this very body: sending its samples again would be refused again.
        if (res.status !== 400) sampler.putBack(usage);
        throw new Error(`control plane answered ${res.status}: ${await res.text()}`);
      }
    } catch (err) {
      if (err instanceof TypeError || (err instanceof Error && err.name === 'TimeoutError')) sampler.putBack(usage);
      throw err;
    }
  };
  let lastFailure = '';
  const beat = async () => {
    try {
      await heartbeat();
      if (lastFailure) log.info('heartbeat: control plane reachable again');
      lastFailure = '';
    } catch (err) {
      metrics.heartbeatFailures.inc();
      const message = err instanceof Error ? err.message : String(err);
      if (message !== lastFailure) log.warn(`heartbeat failed: ${message}`);
      lastFailure = message;
    }
  };
  await beat();
  // One heartbeat at a time: the control plane relies on each list being taken after the
  // previous heartbeat was answered (see HostService.noticeVanishedSandboxes), so a slow
  // control plane must not get two overlapping beats.
  let beating = false;
  const timer = setInterval(() => {
    if (beating) return;
    beating = true;
    void beat().finally(() => { beating = false; });
  }, ha.heartbeatIntervalMs);

  const close = async () => {
    if (stopped) return;
    stopped = true;
    clearInterval(timer);
    sampler.stop();
    clearInterval(parentWatch);
    await server.close();
    // Sandboxes keep running: the next host agent adopts them.
    await driver.close();
    await tracing?.shutdown();
  };

  // A child host agent goes away with its server (the server may die by kill -9 and cannot
  // tell us). Sandboxes survive; the restarted server's host agent adopts them.
  const parentPid = process.ppid;
  const parentWatch = setInterval(() => {
    if (ha.exitWithParent && process.ppid !== parentPid) {
      log.warn('parent process is gone; host agent exiting (sandboxes keep running)');
      void close().then(() => process.exit(0));
    }
  }, 500);
  return { url, close };
}

/**
 * What this host offers to placement: its vCPUs, memory and the size of the file system its
 * sandboxes' disks live on (the data dir's), each replaced by the operator's
 * NESTBOX_HOST_CAPACITY_* when set. Read at every heartbeat (a grown volume shows at once).
 */
function hostCapacity(config: Config): Heartbeat['capacity'] {
  const override = config.hostAgent.capacityOverride;
  const fs = statfsSync(config.dataDir);
  return {
    cpu: override.cpu ?? availableParallelism(),
    memoryMiB: override.memoryMiB ?? Math.floor(totalmem() / 1024 ** 2),
    diskGiB: override.diskGiB ?? Math.floor((fs.blocks * fs.bsize) / 1024 ** 3),
  };
}

/** What the driver's live sandboxes hold (their limits, not what they use), for operators to compare with the database's count. */
async function allocationOf(driver: Driver, known: number): Promise<Heartbeat['allocated']> {
  const live = await driver.usage().catch(() => []);
  const sum = (f: (u: (typeof live)[number]) => number) => live.reduce((total, u) => total + f(u), 0);
  return {
    cpu: sum((u) => u.cpuLimit),
    memoryMiB: Math.round(sum((u) => (u.memoryLimitBytes ?? 0) / 1024 ** 2)),
    diskGiB: Math.round(sum((u) => (u.diskTotalBytes ?? 0) / 1024 ** 3)),
    sandboxes: known,
  };
}

/** This release (package.json's version), reported so operators can see mixed versions. */
function releaseVersion(): string {
  try {
    return String((JSON.parse(readFileSync(projectPath('package.json'), 'utf8')) as { version?: string }).version ?? 'unknown');
  } catch {
    return 'unknown';
  }
}

/**
 * NESTBOX_DRIVER=cloud-hypervisor: every sandbox a microVM. The VM image is built (or reused)
 * before registering, for the same reason as the base image above.
 */
async function createCloudHypervisorDriver(config: Config, log: Logger): Promise<Driver> {
  const ha = config.hostAgent;
  const { ChDriver } = await import('../host/drivers/cloud-hypervisor/driver.js');
  const { ensureVmImage } = await import('../host/images/vm-image.js');
  await ensureVmImage({ imagesDir: config.imagesDir, guestAgentBundle: GUEST_AGENT_BUNDLE(), onProgress: (line) => log.info(`image: ${line}`) });
  // The code-interpreter disk, in the background like the local driver's image (the driver
  // only reads it: a create before it is ready gets a 409). On this driver it is built at start
  // whatever NESTBOX_CODE_INTERPRETER_IMAGE says: a driver that boots prebuilt disks cannot build one per create.
  const { ensureVmCodeInterpreterImage } = await import('../host/images/vm-code-interpreter-image.js');
  void ensureVmCodeInterpreterImage({ imagesDir: config.imagesDir, guestAgentBundle: GUEST_AGENT_BUNDLE(), onProgress: (line) => log.info(`image: ${line}`) }).catch((err: unknown) =>
    log.error({ err: err instanceof Error ? err.message : String(err) }, 'image: the code-interpreter VM image could not be built; restart the host agent to try again'),
  );
  return new ChDriver({
    dataDir: config.dataDir,
    imagesDir: config.imagesDir,
    ociStoreDir: config.images.ociStoreDir,
    ownerId: `${ha.hostId}-${createHash('sha256').update(config.dataDir).digest('hex').slice(0, 12)}`,
    chBinary: ha.chBinary,
    subnet: ha.subnet,
    memoryRestoreMode: ha.chMemoryRestore,
    maxVcpus: ha.chMaxVcpus,
    maxMemoryMiB: ha.chMaxMemoryMiB,
    virtiofsdBinary: ha.chVirtiofsd,
    reflinkStore: ha.reflinkStore === 'auto' ? { imagePath: `${config.dataDir}/store.xfs`, sizeBytes: ha.reflinkStoreGiB * 1024 ** 3 } : 'off',
    logger: log,
  });
}

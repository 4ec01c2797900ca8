// The commands that run Nestbox itself on this machine (not clients of the API): `server`,
// `host-agent`, `host-secret`, and `image build|pull|list` on the local image store.
import { Option, type Command } from 'commander';
import { ConfigError, type Config } from '../config.js';

function stopOn(close: () => Promise<void>): void {
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      void close().then(() => process.exit(0), () => process.exit(1));
    });
  }
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

export function registerServerCommands(program: Command, config: () => Config): void {
  program
    .command('server')
    .description('control plane + local host agent (+ PGlite unless NESTBOX_DATABASE_URL is set), run in a worker process that is restarted if it dies (NESTBOX_SERVER_SUPERVISOR); the default command')
    // The supervisor starts its worker as `server --worker`; not for people.
    .addOption(new Option('--worker').hideHelp())
    .action(async (opts: { worker?: boolean }) => {
      const cfg = config();
      const isWorker = opts.worker === true;
      if (cfg.serverSupervisor && !isWorker) {
        const { superviseServer } = await import('../supervisor.js');
        const supervisor = superviseServer(cfg);
        stopOn(supervisor.stop);
        return;
      }
      const { createLogger } = await import('../logger.js');
      const logger = createLogger({ level: cfg.logLevel });
      if (isWorker) {
        // A rejected promise nobody awaited is a bug in one request's handling, not a reason to
        // drop every other request: log it and keep serving. Exceptions still end the worker
        // (its state may be broken), and the supervisor starts a fresh one.
        process.on('unhandledRejection', (reason) => {
          logger.error({ component: 'server', err: reason }, `unhandled rejection (the worker keeps running): ${reason instanceof Error ? reason.message : String(reason)}`);
        });
      }
      const { startServer } = await import('../server.js');
      // The signal handlers go in before the start: a SIGTERM while it starts (systemd stopping a
      // unit that is still coming up) then closes what has started instead of killing it mid-way.
      const starting = startServer(cfg, logger);
      let closing: Promise<void> | undefined;
      const close = () => (closing ??= starting.then((server) => server.close()));
      stopOn(close);
      await starting;
      if (isWorker) {
        // stdin is the supervisor's pipe: its end means the supervisor is gone (even by kill -9).
        const orphaned = () => void close().then(() => process.exit(0));
        process.stdin.once('end', orphaned);
        process.stdin.once('error', orphaned);
        process.stdin.resume();
      }
    });

  program
    .command('host-agent')
    .description('run a host agent alone (needs NESTBOX_CONTROL_PLANE_URL, NESTBOX_HOST_AGENT_SECRET)')
    .action(async () => {
      const { startHostAgent } = await import('../host-agent.js');
      const agent = await startHostAgent(config());
      stopOn(agent.close);
    });

  program
    .command('host-secret')
    .description('print the secret a remote host agent with this id must use (needs NESTBOX_HOST_SECRET)')
    .argument('<hostId>', 'the host agent\'s NESTBOX_HOST_ID')
    .action(async (hostId: string) => {
      const cfg = config();
      if (!cfg.hostSecret) throw new ConfigError('host-secret needs NESTBOX_HOST_SECRET set');
      const { deriveHostSecret } = await import('../../core/services/hosts.js');
      console.log(deriveHostSecret(cfg.hostSecret, hostId));
    });

  const image = program.command('image').description('the local image store of this machine (see `images` for the server\'s images)');
  image
    .command('build')
    .description('build (or reuse) the default base image under the images dir; --vm: the cloud-hypervisor VM image (kernel, initramfs, ext4 rootfs)')
    .option('--vm', 'the cloud-hypervisor VM image instead')
    .action(async (opts: { vm?: boolean }) => {
      const cfg = config();
      if (opts.vm) {
        // Kernel + initramfs + ext4 rootfs for the cloud-hypervisor driver (minutes the first time).
        const { ensureVmImage } = await import('../../host/images/vm-image.js');
        const { GUEST_AGENT_BUNDLE, projectPath } = await import('../paths.js');
        const vm = await ensureVmImage({ imagesDir: cfg.imagesDir, guestAgentBundle: GUEST_AGENT_BUNDLE(), ptyHelperBinary: projectPath('dist/nestbox-pty'), onProgress: (l) => console.log(l) });
        console.log(`vm image ready: ${vm.kernel} ${vm.initramfs} ${vm.rootfs}`);
        return;
      }
      const { ensureBaseImage } = await import('../../host/images/base-image.js');
      const built = await ensureBaseImage({ imagesDir: cfg.imagesDir, name: 'default', onProgress: (l) => console.log(l) });
      console.log(`image ready: ${built.rootfs}`);
    });

  const ociStore = async (cfg: Config) => {
    const { OciImageStore } = await import('../../host/images/oci/store.js');
    return new OciImageStore({ storeDir: cfg.images.ociStoreDir, mirrors: cfg.images.mirrors, insecureRegistries: cfg.images.insecureRegistries, pullTimeoutMs: cfg.images.pullTimeoutMs });
  };
  image
    .command('pull')
    .description('pull an OCI/Docker image into the local image store (NESTBOX_OCI_STORE_DIR); prints its id (sha256:…), which a local sandbox spec can name as its image')
    .argument('<reference>', 'registry/name:tag or name@sha256:…')
    .option('--username <name>', 'registry user (the password comes from --password-stdin)')
    .option('--password-stdin', 'read the registry password from stdin (never argv)')
    .action(async (reference: string, opts: { username?: string; passwordStdin?: boolean }) => {
      const cfg = config();
      if ((opts.username === undefined) !== !opts.passwordStdin) throw new ConfigError('image pull: --username and --password-stdin go together (the password is read from stdin, never argv)');
      const password = opts.username === undefined ? undefined : (await readStdin()).replace(/\r?\n$/, '');
      const store = await ociStore(cfg);
      const pulled = await store.pull(reference, { credentials: opts.username === undefined ? undefined : { username: opts.username, password: password! }, onProgress: (line) => console.error(line) });
      console.log(pulled.meta.id);
    });
  image
    .command('list')
    .description('the pulled OCI images (JSON lines)')
    .action(async () => {
      const store = await ociStore(config());
      for (const meta of await store.list()) console.log(JSON.stringify({ id: meta.id, reference: meta.reference, sizeBytes: meta.sizeBytes, created: meta.created, pulledAt: meta.pulledAt }));
    });
}

#!/usr/bin/env node
// Entry point: `nestbox server` (default), `nestbox host-agent`, `nestbox image build|pull|list`.
import { ConfigError, loadConfig } from './config.js';

const usage = `usage: nestbox <command>

  server        control plane + local host agent (+ PGlite unless NESTBOX_DATABASE_URL is set),
                run in a worker process that is restarted if it dies (NESTBOX_SERVER_SUPERVISOR)
  host-agent    run a host agent alone (needs NESTBOX_CONTROL_PLANE_URL, NESTBOX_HOST_AGENT_SECRET)
  host-secret <hostId>
                print the secret a remote host agent with this id must use
  image build   build (or reuse) the default base image under the images dir
  image build --vm
                build (or reuse) the cloud-hypervisor VM image (kernel, initramfs, ext4 rootfs)
  image pull <reference> [--username <name> --password-stdin]
                pull an OCI/Docker image into the local image store (NESTBOX_OCI_STORE_DIR);
                prints its id (sha256:…), which a local sandbox spec can name as its image
  image list    the pulled OCI images (JSON lines)
  build -t <name[:tag]> [-f Dockerfile] [--build-arg K=V] [--no-cache] [--egress …] <dir>
                build an image from a Dockerfile and a context directory on the server
                (NESTBOX_URL, NESTBOX_API_KEY; default this machine's server and bootstrap key),
                printing the build log as it runs
  mcp           an MCP server over stdio for AI agents, a client of the server above (same
                NESTBOX_URL / NESTBOX_API_KEY defaults as build)`;

async function main(argv: string[]): Promise<void> {
  const [command = 'server', ...rest] = argv;
  const config = loadConfig();
  const stopOn = (close: () => Promise<void>) => {
    for (const signal of ['SIGINT', 'SIGTERM'] as const) {
      process.once(signal, () => {
        void close().then(() => process.exit(0));
      });
    }
  };
  switch (command) {
    case 'server': {
      const { WORKER_FLAG, superviseServer } = await import('./supervisor.js');
      const isWorker = rest.includes(WORKER_FLAG);
      if (config.serverSupervisor && !isWorker) {
        const supervisor = superviseServer(config);
        stopOn(supervisor.stop);
        return;
      }
      const { createLogger } = await import('./logger.js');
      const logger = createLogger({ level: config.logLevel });
      if (isWorker) {
        // A rejected promise nobody awaited is a bug in one request's handling, not a reason to
        // drop every other request: log it and keep serving. Exceptions still end the worker
        // (its state may be broken), and the supervisor starts a fresh one.
        process.on('unhandledRejection', (reason) => {
          logger.error({ component: 'server', err: reason }, `unhandled rejection (the worker keeps running): ${reason instanceof Error ? reason.message : String(reason)}`);
        });
      }
      const { startServer } = await import('./server.js');
      const server = await startServer(config, logger);
      let closing: Promise<void> | undefined;
      const close = () => (closing ??= server.close());
      stopOn(close);
      if (isWorker) {
        // stdin is the supervisor's pipe: its end means the supervisor is gone (even by kill -9).
        const orphaned = () => void close().then(() => process.exit(0));
        process.stdin.once('end', orphaned);
        process.stdin.once('error', orphaned);
        process.stdin.resume();
      }
      return;
    }
    case 'host-agent': {
      const { startHostAgent } = await import('./host-agent.js');
      const agent = await startHostAgent(config);
      stopOn(agent.close);
      return;
    }
    case 'host-secret': {
      const hostId = rest[0];
      if (!hostId || !config.hostSecret) throw new ConfigError('host-secret needs a host id argument and NESTBOX_HOST_SECRET set');
      const { deriveHostSecret } = await import('../core/services/hosts.js');
      console.log(deriveHostSecret(config.hostSecret, hostId));
      return;
    }
    case 'image': {
      if (rest[0] === 'pull' || rest[0] === 'list') {
        const { OciImageStore } = await import('../host/images/oci/store.js');
        const store = new OciImageStore({ storeDir: config.images.ociStoreDir, mirrors: config.images.mirrors, insecureRegistries: config.images.insecureRegistries, pullTimeoutMs: config.images.pullTimeoutMs });
        if (rest[0] === 'list') {
          for (const meta of await store.list()) console.log(JSON.stringify({ id: meta.id, reference: meta.reference, sizeBytes: meta.sizeBytes, created: meta.created, pulledAt: meta.pulledAt }));
          return;
        }
        const reference = rest[1];
        if (!reference || reference.startsWith('--')) throw new ConfigError('image pull needs an image reference (registry/name:tag or name@sha256:…)');
        const userAt = rest.indexOf('--username');
        const username = userAt >= 0 ? rest[userAt + 1] : undefined;
        if ((username === undefined) !== !rest.includes('--password-stdin')) throw new ConfigError('image pull: --username and --password-stdin go together (the password is read from stdin, never argv)');
        const password = username === undefined ? undefined : (await readStdin()).replace(/\r?\n$/, '');
        const image = await store.pull(reference, { credentials: username === undefined ? undefined : { username, password: password! }, onProgress: (line) => console.error(line) });
        console.log(image.meta.id);
        return;
      }
      if (rest[0] !== 'build') break;
      if (rest.includes('--vm')) {
        // Kernel + initramfs + ext4 rootfs for the cloud-hypervisor driver (minutes the first time).
        const { ensureVmImage } = await import('../host/images/vm-image.js');
        const { GUEST_AGENT_BUNDLE, projectPath } = await import('./paths.js');
        const vm = await ensureVmImage({ imagesDir: config.imagesDir, guestAgentBundle: GUEST_AGENT_BUNDLE(), ptyHelperBinary: projectPath('dist/nestbox-pty'), onProgress: (l) => console.log(l) });
        console.log(`vm image ready: ${vm.kernel} ${vm.initramfs} ${vm.rootfs}`);
        return;
      }
      const { ensureBaseImage } = await import('../host/images/base-image.js');
      const image = await ensureBaseImage({ imagesDir: config.imagesDir, name: 'default', onProgress: (l) => console.log(l) });
      console.log(`image ready: ${image.rootfs}`);
      return;
    }
    case 'build': {
      const { runBuildCommand } = await import('./cli-build.js');
      process.exitCode = await runBuildCommand(config, rest);
      return;
    }
    case 'mcp': {
      const { clientTarget } = await import('./cli-build.js');
      const { runMcpStdio } = await import('./mcp/stdio.js');
      await runMcpStdio(clientTarget(config));
      return;
    }
    case 'help':
    case '--help':
      console.log(usage);
      return;
  }
  console.error(usage);
  process.exit(2);
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

main(process.argv.slice(2)).catch(async (err: unknown) => {
  // An image pull's failure (not_found, unauthorized…) is the user's to read, not a stack trace.
  const imageError = err instanceof Error && err.name === 'ImageError' ? `${(err as Error & { code: string }).code}: ${err.message}` : undefined;
  console.error(err instanceof ConfigError ? err.message : (imageError ?? (err instanceof Error ? (err.stack ?? err.message) : String(err))));
  // A supervised worker that cannot start because of its configuration is not restarted.
  const { WORKER_FATAL_EXIT_CODE, WORKER_FLAG } = await import('./supervisor.js');
  process.exit(err instanceof ConfigError && process.argv.includes(WORKER_FLAG) ? WORKER_FATAL_EXIT_CODE : 1);
});

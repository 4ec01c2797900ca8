// Entry point of the Cloud Hypervisor simulator, run as a fake `cloud-hypervisor` executable
// with the real flags (test-only; see launcher.ts for how tests install it):
//   cloud-hypervisor --api-socket path=<sock> [--event-monitor path=<file>] [--log-file <file>] [-v…]
//   cloud-hypervisor --version
// Settings the real binary does not have come from the environment:
//   NESTBOX_CH_SIM_GUEST_AGENT   the guest agent bundle to "boot" (dist/guest-agent.mjs)
//   NESTBOX_CH_API_SPEC          the pinned API YAML (default: the repository's vendor/cloud-hypervisor/)
//   NESTBOX_CH_SIM_FAULTS        a JSON file { "<sandbox id>": Faults }, re-read on every request
//   NESTBOX_CH_SIM_LATENCY_MS, NESTBOX_CH_SIM_FAIL_ON (comma list), NESTBOX_CH_SIM_CRASH_ON,
//   NESTBOX_CH_SIM_VANISH_ON, NESTBOX_CH_SIM_AGENT_NEVER_READY=1   faults for every VM
import { loadChSchemas } from './schema.js';
import { faultKeyFor, SIM_VERSION, SimulatedVmm, type Faults } from './vmm.js';

function fail(message: string): never {
  process.stderr.write(`cloud-hypervisor (simulator): ${message}\n`);
  process.exit(1);
}

/** CH's option syntax: `path=<p>` (also `fd=` for the API socket, which we do not support). */
function pathOption(value: string | undefined, flag: string): string {
  if (!value) fail(`${flag} needs a value`);
  if (value.startsWith('fd=')) fail(`${flag} fd=… is not supported by the simulator`);
  const path = value.startsWith('path=') ? value.slice('path='.length).split(',')[0] : value;
  if (!path.startsWith('/')) fail(`${flag}: expected an absolute path, got ${value}`);
  return path;
}

export function parseArgs(argv: string[]): { apiSocket?: string; eventMonitor?: string; logFile?: string; version: boolean } {
  const parsed: { apiSocket?: string; eventMonitor?: string; logFile?: string; version: boolean } = { version: false };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    switch (flag) {
      case '--api-socket':
        parsed.apiSocket = pathOption(argv[++i], flag);
        break;
      case '--event-monitor':
        parsed.eventMonitor = pathOption(argv[++i], flag);
        break;
      case '--log-file':
        parsed.logFile = pathOption(argv[++i], flag);
        break;
      case '--version':
      case '-V':
        parsed.version = true;
        break;
      case '--seccomp':
        i++;
        break;
      default:
        if (/^-v+$/.test(flag)) break;
        fail(`unsupported argument ${flag} (the simulator accepts --api-socket, --event-monitor, --log-file, --seccomp, -v, --version)`);
    }
  }
  return parsed;
}

function envFaults(): Faults {
  const env = process.env;
  return {
    latencyMs: env.NESTBOX_CH_SIM_LATENCY_MS ? Number(env.NESTBOX_CH_SIM_LATENCY_MS) : undefined,
    failOn: env.NESTBOX_CH_SIM_FAIL_ON ? env.NESTBOX_CH_SIM_FAIL_ON.split(',').map((route) => route.trim()) : undefined,
    crashOn: env.NESTBOX_CH_SIM_CRASH_ON || undefined,
    vanishOn: env.NESTBOX_CH_SIM_VANISH_ON || undefined,
    agentNeverReady: env.NESTBOX_CH_SIM_AGENT_NEVER_READY === '1' || undefined,
  };
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  if (args.version) {
    process.stdout.write(`cloud-hypervisor ${SIM_VERSION}\n`);
    return;
  }
  if (!args.apiSocket) fail('--api-socket is required (the simulator has no CLI-only mode)');
  const agentBundle = process.env.NESTBOX_CH_SIM_GUEST_AGENT;
  if (!agentBundle) fail('NESTBOX_CH_SIM_GUEST_AGENT must name the guest agent bundle');
  const vmm = new SimulatedVmm({
    apiSocket: args.apiSocket,
    eventMonitor: args.eventMonitor,
    logFile: args.logFile,
    validator: loadChSchemas(),
    agentBundle,
    nodeBinary: process.execPath,
    faultKey: faultKeyFor(args.apiSocket),
    envFaults: envFaults(),
    faultsFile: process.env.NESTBOX_CH_SIM_FAULTS,
    lockDir: process.env.NESTBOX_CH_SIM_LOCK_DIR ?? '/tmp/nestbox-ch-sim-locks',
    onExit: (code) => process.exit(code),
  });
  for (const signal of ['SIGTERM', 'SIGINT'] as const) {
    process.once(signal, () => {
      void vmm.teardown().finally(() => process.exit(0));
    });
  }
  await vmm.listen();
}

main().catch((error: unknown) => fail((error as Error)?.stack ?? String(error)));

// The layering as a check that can fail (`npm run check:layers`, run by `npm test`).
//
// The house, top to bottom (ARCHITECTURE.md):
//   src/      the composition root: config, CLI, processes, the express app and native handlers
//   compat/   Daytona and E2B front doors, translating onto core
//   http-kit/ the HTTP helpers both front doors share (request checks, streamed bodies, upgrade
//             claims): below src and compat, above core
//   core/     the engine: services, store, state table, errors, and `HostClient`, the interface
//             through which it drives a host
//   host/     what runs on a sandbox host: the host agent, the drivers, images, the guest agent,
//             and the two wire protocols (`host/protocol/` control plane ↔ host agent, whose
//             client implements core's `HostClient`; `host/agent-protocol/` host ↔ guest agent)
// An import may point down or sideways, never back up. Tests (and their helpers) may import
// whatever they exercise, so the layer rules below apply to program code only; circles are
// forbidden everywhere.

/** Test-only modules: never part of the program, never emitted to dist/ (keep in step with tsconfig.json's exclude). */
const TEST_ONLY = '(^(test|contract-tests)/|^host/sim/|\\.test\\.ts$|(^|/)(test-support|testing|[^/]+-testing)\\.ts$)';

/**
 * The wire contracts core may know: the zod schemas and types of the two internal APIs
 * (host-agent API; guest-agent exec, files and processes). They are data descriptions that import
 * nothing but zod and each other (rule `wire-contracts-are-leaves`), so importing one gives core
 * the shape of what a host or a guest answers without a dependency on how it is reached. The
 * clients (`host/protocol/client.ts`, `host/agent-protocol/client.ts`), the HMAC and framing
 * helpers, servers and drivers are host implementation: core reaches them only through
 * `HostClient`. A new contract file is added here.
 */
const WIRE_CONTRACTS = '^host/(protocol/schemas|agent-protocol/(types|processes|files))\\.ts$';

/** Program code in the project (not npm packages or Node built-ins). */
const PROGRAM = '^(src|http-kit|core|host|compat|bench)/';

module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      comment:
        'An import circle means neither module can be understood, tested or moved without the other. ' +
        'Type-only imports count: they tie two modules’ meanings together just the same.',
      severity: 'error',
      from: {},
      to: { circular: true },
    },
    {
      name: 'compat-not-to-src',
      comment:
        'compat translates foreign APIs onto core and receives what it needs from core (a narrow port) ' +
        'or from the shared HTTP kit below both front doors; src is the composition root above it.',
      severity: 'error',
      from: { path: '^compat/', pathNot: TEST_ONLY },
      to: { path: '^src/' },
    },
    {
      name: 'front-doors-not-to-the-guest-protocol',
      comment:
        'The front doors (native handlers, compat, the HTTP kit) reach a sandbox only through core\'s typed toolbox; ' +
        'the guest agent\'s wire protocol (host/agent-protocol, host/guest-agent) is the typed guest client\'s alone. ' +
        'request-body.ts is the exception: a generic reader of request bodies both hops use.',
      severity: 'error',
      from: { path: '^(compat|src/http|http-kit)/', pathNot: TEST_ONLY },
      to: { path: '^host/(agent-protocol|guest-agent)/', pathNot: '^host/agent-protocol/request-body\\.ts$' },
    },
    {
      name: 'http-kit-not-to-front-doors',
      comment: 'The kit sits below both front doors and the composition root, so both can use it.',
      severity: 'error',
      from: { path: '^http-kit/', pathNot: TEST_ONLY },
      to: { path: '^(src|compat)/' },
    },
    {
      name: 'core-not-to-src-or-compat',
      comment: 'core is below both front doors and the composition root.',
      severity: 'error',
      from: { path: '^core/', pathNot: TEST_ONLY },
      to: { path: '^(src|http-kit|compat)/' },
    },
    {
      name: 'core-to-host-only-wire-contracts',
      comment:
        'core drives hosts through its own HostClient interface, implemented in host/protocol; of host/ ' +
        'it may import only the wire contracts (see WIRE_CONTRACTS in this file).',
      severity: 'error',
      from: { path: '^core/', pathNot: TEST_ONLY },
      to: { path: '^host/', pathNot: WIRE_CONTRACTS },
    },
    {
      name: 'wire-contracts-are-leaves',
      comment: 'A wire contract core may import must not pull host implementation (or anything above) in behind it.',
      severity: 'error',
      from: { path: WIRE_CONTRACTS },
      to: { path: PROGRAM, pathNot: WIRE_CONTRACTS },
    },
    {
      name: 'host-not-to-src-or-compat',
      comment: 'host/ (host agent, drivers, images, guest agent, wire protocols) is below the front doors and the composition root.',
      severity: 'error',
      from: { path: '^host/', pathNot: TEST_ONLY },
      to: { path: '^(src|http-kit|compat)/' },
    },
    {
      name: 'guest-agent-not-to-core',
      comment:
        'The guest agent runs inside every sandbox, bundled into one file (scripts/bundle-guest-agent.mjs); it speaks ' +
        'only the guest wire contract (host/agent-protocol) and knows nothing of the control plane.',
      severity: 'error',
      from: { path: '^host/guest-agent/', pathNot: TEST_ONLY },
      to: { path: '^(core|src|compat)/' },
    },
    {
      name: 'guest-agent-bundle-not-reaching-control-plane',
      comment:
        'The same for everything the bundle contains: nothing reachable from the guest agent’s entry point may be ' +
        'control-plane code, however indirectly (it would run inside the sandbox).',
      severity: 'error',
      from: { path: '^host/guest-agent/main\\.ts$' },
      to: { path: '^(core|src|compat)/', reachable: true },
    },
    {
      name: 'drivers-not-to-each-other',
      comment:
        'Each driver stands on its own behind host/drivers/types.ts; what two drivers share (network, storage, ' +
        'records, locks) lives in a module of its own under host/, not inside one of them: host/drivers/base/ ' +
        '(the shared driver base) is the one folder under drivers/ every driver may use, and it uses none of them.',
      severity: 'error',
      from: { path: '^host/drivers/([^/]+)/', pathNot: TEST_ONLY },
      to: { path: '^host/drivers/[^/]+/', pathNot: '^host/drivers/($1|base)/' },
    },
    {
      name: 'program-not-to-test-only',
      comment:
        'Test helpers and the Cloud Hypervisor simulator are not emitted to dist/ (tsconfig.json), so the program must ' +
        'not import them: tsc would compile and ship an imported one anyway.',
      severity: 'error',
      from: { path: PROGRAM, pathNot: TEST_ONLY },
      to: { path: TEST_ONLY },
    },
    {
      name: 'not-to-unresolvable',
      comment: 'An import that does not resolve is invisible to every rule above (and fails at run time).',
      severity: 'error',
      from: {},
      to: { couldNotResolve: true },
    },
  ],
  options: {
    // swc parses TypeScript here: dependency-cruiser's tsc parser needs TypeScript < 7's compiler API,
    // which TypeScript 7 no longer has.
    parser: 'swc',
    // Type-only imports are dependencies too (see no-circular).
    tsPreCompilationDeps: true,
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '^(node_modules|dist)/' },
    // node_modules may be a symlink (a shared install); keep resolved packages under node_modules/.
    preserveSymlinks: true,
    // Resolve package subpath exports (`@bufbuild/protobuf/wkt`) and the sources' `.js` specifiers.
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['import', 'require', 'node', 'default', 'types'],
      extensions: ['.ts', '.js', '.mjs', '.cjs', '.json', '.d.ts'],
      mainFields: ['module', 'main', 'types', 'typings'],
    },
    cache: false,
  },
};

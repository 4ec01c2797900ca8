// Pure logic of the Cloud Hypervisor driver, without any VMM: the VmConfig builder checked
// against the pinned API description (objects closed, so a misspelt field fails), the
// config.json patcher, the event-monitor stream parser, the API client's status/error
// conventions, the state assertions, and the hybrid-vsock dialer against a mock muxer.
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer as createHttpServer, type Server as HttpServer } from 'node:http';
import { createServer, type Server, type Socket } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient } from '../../agent-protocol/client.js';
import { loadChSchemas, type ChSchemaValidator } from '../../sim/ch/schema.js';
import { ChApi, ChApiError, parseErrorChain, type VmConfig } from './api.js';
import { buildVmConfig, GUEST_MAC, patchSnapshotConfig, volumeTag } from './config.js';
import { guestMountScript, virtiofsdCommand } from './virtiofs.js';
import { expectState, transition, VmOperationError } from './lifecycle.js';
import { EventStreamParser, launchCommand } from './process.js';
import { dialHybridVsock, HybridVsockAgent, VsockDialError } from './vsock.js';

const PATHS = {
  kernel: '/var/lib/nestbox/images/vm-default/vmlinuz',
  initramfs: '/var/lib/nestbox/images/vm-default/initrd.img',
  rootfsDisk: '/var/lib/nestbox/sandboxes/a/disk/rootfs.img',
  vsockSocket: '/var/lib/nestbox/sandboxes/a/run/vsock.sock',
  serialLog: '/var/lib/nestbox/sandboxes/a/serial.log',
};

let dir: string;
let schemas: ChSchemaValidator;
beforeAll(() => {
  dir = mkdtempSync('/tmp/nbch-unit-');
  schemas = loadChSchemas();
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('VmConfig builder', () => {
  it('builds a body the pinned v53.0 schema accepts with every object closed', () => {
    const config = buildVmConfig({ cpu: 2, memoryMiB: 1024, nested: true }, PATHS);
    expect(schemas.validate('VmConfig', config)).toEqual([]);
    expect(config.cpus).toEqual({ boot_vcpus: 2, max_vcpus: 2, nested: true });
    expect(config.memory?.size).toBe(1024 * 1024 * 1024);
    expect(config.disks).toEqual([{ id: 'rootfs', path: PATHS.rootfsDisk, image_type: 'Raw', readonly: false }]);
    expect(config.net?.[0]).toMatchObject({ tap: 'tap0', mac: GUEST_MAC });
    expect(config.vsock).toEqual({ id: 'vsock0', cid: 3, socket: PATHS.vsockSocket });
    expect(config.serial).toEqual({ mode: 'File', file: PATHS.serialLog });
    expect(config.console).toEqual({ mode: 'Off' });
    expect(config.rng).toEqual({ src: '/dev/urandom' });
    expect(config.payload.cmdline).toContain('console=ttyS0');
  });

  it('rounds fractional CPUs up to whole vCPUs', () => {
    expect(buildVmConfig({ cpu: 0.5, memoryMiB: 256, nested: false }, PATHS).cpus).toEqual({ boot_vcpus: 1, max_vcpus: 1, nested: false });
  });

  it('the closed schema catches what real CH would silently ignore', () => {
    const config = buildVmConfig({ cpu: 1, memoryMiB: 512, nested: true }, PATHS) as VmConfig & { memory: Record<string, unknown> };
    const typo = { ...config, memory: { ...config.memory, shraed: true } };
    expect(schemas.validate('VmConfig', typo).join()).toMatch(/shraed/);
    const stringCid = { ...config, vsock: { ...config.vsock, cid: '3' } };
    expect(schemas.validate('VmConfig', stringCid).join()).toMatch(/vsock\/cid/);
    const badFormat = { ...config, disks: [{ ...config.disks![0], pci_device_id: 300 }] };
    expect(schemas.validate('VmConfig', badFormat).join()).toMatch(/pci_device_id/);
    expect(schemas.validate('RestoreConfig', { source_url: 'file:///x', memory_restore_mode: 'Lazy' }).length).toBeGreaterThan(0);
  });
});

describe('VmConfig builder: volumes and resize room (issue 19)', () => {
  it('passes one fs entry per share and makes guest memory shared, as virtio-fs needs', () => {
    const fs = [
      { tag: volumeTag(0), socket: '/var/lib/nestbox/sandboxes/a/run/fs0.sock' },
      { tag: volumeTag(1), socket: '/var/lib/nestbox/sandboxes/a/run/fs1.sock' },
    ];
    const config = buildVmConfig({ cpu: 1, memoryMiB: 512, nested: false, fs }, PATHS);
    expect(schemas.validate('VmConfig', config)).toEqual([]);
    expect(config.fs).toEqual([
      { tag: 'nbvol0', socket: fs[0]!.socket, num_queues: 1, queue_size: 1024, id: 'nbvol0' },
      { tag: 'nbvol1', socket: fs[1]!.socket, num_queues: 1, queue_size: 1024, id: 'nbvol1' },
    ]);
    expect(config.memory?.shared).toBe(true);
    for (const entry of config.fs ?? []) expect(schemas.validate('FsConfig', entry)).toEqual([]);
    // Without shares: no fs field at all, private memory.
    const plain = buildVmConfig({ cpu: 1, memoryMiB: 512, nested: false }, PATHS);
    expect(plain.fs).toBeUndefined();
    expect(plain.memory?.shared).toBe(false);
  });

  it('sets max_vcpus and a virtio-mem hotplug room from the ceilings, in 128 MiB steps', () => {
    const config = buildVmConfig({ cpu: 1.5, memoryMiB: 512, nested: false, maxVcpus: 8, maxMemoryMiB: 4096 + 100 }, PATHS);
    expect(schemas.validate('VmConfig', config)).toEqual([]);
    expect(config.cpus).toMatchObject({ boot_vcpus: 2, max_vcpus: 8 });
    expect(config.memory).toMatchObject({ size: 512 * 2 ** 20, hotplug_size: 3584 * 2 ** 20, hotplug_method: 'VirtioMem' });
    // A ceiling below the boot size gives no room rather than a config CH refuses.
    const none = buildVmConfig({ cpu: 4, memoryMiB: 2048, nested: false, maxVcpus: 2, maxMemoryMiB: 1024 }, PATHS);
    expect(none.cpus).toMatchObject({ boot_vcpus: 4, max_vcpus: 4 });
    expect(none.memory?.hotplug_size).toBeUndefined();
    expect(none.memory?.hotplug_method).toBeUndefined();
  });

  it('the closed schema refuses a misspelt fs field', () => {
    const config = buildVmConfig({ cpu: 1, memoryMiB: 256, nested: false, fs: [{ tag: 'nbvol0', socket: '/x.sock' }] }, PATHS);
    (config.fs![0] as unknown as Record<string, unknown>).queue_sise = 8;
    expect(schemas.validate('VmConfig', config).join('\n')).toMatch(/queue_sise/);
  });
});

describe('virtio-fs helpers', () => {
  it('runs virtiofsd in its own mount namespace, its share a read-only bind for ro mounts', () => {
    const share = { tag: 'nbvol0', socket: '/d/run/fs0.sock', source: '/d/volumes/v/mnt/data', readOnly: true };
    const qemu = virtiofsdCommand('/usr/lib/qemu/virtiofsd', share);
    expect(qemu.file).toBe('unshare');
    expect(qemu.args.slice(0, 4)).toEqual(['--mount', '--propagation', 'private', '--']);
    expect(qemu.args.join(' ')).toContain('mount -o remount,bind,ro "$1" "$1"');
    expect(qemu.args.slice(-7)).toEqual(['/usr/lib/qemu/virtiofsd', '--socket-path=/d/run/fs0.sock', '-o', 'source=/d/volumes/v/mnt/data', '-o', 'sandbox=namespace', '-o', 'cache=auto'].slice(-7));
    const rust = virtiofsdCommand('/usr/libexec/virtiofsd', { ...share, readOnly: false });
    expect(rust.args).toContain('--shared-dir=/d/volumes/v/mnt/data');
    expect(rust.args.join(' ')).not.toContain('remount');
  });

  it('the guest mount script mounts each tag, a subpath through a stage, ro remounted', () => {
    const script = guestMountScript([
      { volumeId: 'v', tag: 'nbvol0', mountPath: '/data', readOnly: false },
      { volumeId: 'v', tag: 'nbvol1', mountPath: '/ro', readOnly: true, subpath: 'sub/dir' },
    ]);
    expect(script).toContain("mount -t virtiofs -o rw nbvol0 '/data'");
    expect(script).toContain("mount -t virtiofs -o ro nbvol1 '/run/nestbox-volumes/nbvol1'");
    expect(script).toContain("mount --bind '/run/nestbox-volumes/nbvol1/sub/dir' '/ro'");
    expect(script).toContain("mount -o remount,bind,ro '/ro'");
  });
});

describe('snapshot config.json patcher', () => {
  it('retargets disk, vsock and serial, turns shared memory off, keeps everything else', () => {
    const original = { ...buildVmConfig({ cpu: 2, memoryMiB: 512, nested: true }, PATHS), platform: { num_pci_segments: 1 } } as VmConfig;
    original.memory!.shared = true;
    const patched = patchSnapshotConfig(original, { rootfsDisk: '/d/b/rootfs.img', vsockSocket: '/r/b/vsock.sock', serialLog: '/s/b/serial.log' });
    expect(patched.disks?.[0].path).toBe('/d/b/rootfs.img');
    expect(patched.vsock?.socket).toBe('/r/b/vsock.sock');
    expect(patched.serial?.file).toBe('/s/b/serial.log');
    expect(patched.memory?.shared).toBe(false);
    expect(patched.net).toEqual(original.net);
    expect(patched.platform).toEqual({ num_pci_segments: 1 });
    expect(original.disks?.[0].path).toBe(PATHS.rootfsDisk); // the input is not modified
    expect(schemas.validate('VmConfig', patched)).toEqual([]);
  });

  it('refuses a config it cannot make safe', () => {
    const config = buildVmConfig({ cpu: 1, memoryMiB: 256, nested: true }, PATHS);
    expect(() => patchSnapshotConfig({ ...config, vsock: undefined }, { rootfsDisk: 'a', vsockSocket: 'b', serialLog: 'c' })).toThrow(/vsock/);
    expect(() => patchSnapshotConfig({ ...config, disks: [] }, { rootfsDisk: 'a', vsockSocket: 'b', serialLog: 'c' })).toThrow(/rootfs/);
  });
});

describe('event-monitor stream parser', () => {
  it('splits concatenated pretty-printed objects across arbitrary chunk boundaries', () => {
    const events = [
      { timestamp: { secs: 1, nanos: 2 }, source: 'vm', event: 'booting', properties: null },
      { timestamp: { secs: 1, nanos: 3 }, source: 'vm', event: 'booted', properties: { note: 'a } tricky "string" {' } },
      { timestamp: { secs: 2, nanos: 0 }, source: 'vmm', event: 'shutdown', properties: null },
    ];
    const text = events.map((event) => JSON.stringify(event, null, 2)).join('\n');
    for (const size of [1, 7, 64, text.length]) {
      const parser = new EventStreamParser();
      const seen = [];
      for (let i = 0; i < text.length; i += size) seen.push(...parser.push(text.slice(i, i + size)));
      expect(seen).toEqual(events);
    }
  });

  it('keeps an unfinished object for the next chunk and skips a corrupt one', () => {
    const parser = new EventStreamParser();
    expect(parser.push('{"source":"vm","event":"pa')).toEqual([]);
    expect(parser.push('used"}{"source": bad}{"source":"vm","event":"resumed"}')).toEqual([
      { source: 'vm', event: 'paused' },
      { source: 'vm', event: 'resumed' },
    ]);
  });
});

describe('launch command', () => {
  it('runs CH in the slot netns and a private mount namespace, exec-chained so the pid is CH', () => {
    const { file, args } = launchCommand({ binary: '/usr/bin/cloud-hypervisor', netns: '/run/netns/nbx-3', paths: { apiSocket: '/r/api.sock', eventMonitor: '/r/events.json', logFile: '/r/ch.log', stdioLog: '/r/out', pidFile: '/r/pid' } });
    expect([file, ...args]).toEqual(['ip', 'netns', 'exec', 'nbx-3', 'unshare', '--mount', '--propagation', 'private', '--', '/usr/bin/cloud-hypervisor', '--api-socket', 'path=/r/api.sock', '--event-monitor', 'path=/r/events.json', '--log-file', '/r/ch.log']);
  });
});

// ---- API client conventions against a tiny stand-in server -------------------------------------

describe('ChApi', () => {
  let server: HttpServer;
  let api: ChApi;
  let state = 'Running';
  const socket = () => join(dir, 'api.sock');
  beforeAll(async () => {
    server = createHttpServer((req, res) => {
      const send = (status: number, body = '') => res.writeHead(status, { 'content-type': 'application/json' }).end(body);
      switch (req.url) {
        case '/api/v1/vm.pause':
          state = 'Paused';
          return send(204);
        case '/api/v1/vm.resume':
          return send(500, JSON.stringify(['Error from API', 'The VM could not be resumed', 'Invalid VM state transition']));
        case '/api/v1/vmm.shutdown':
          return send(200); // CH's quirk: 200 with an empty body
        case '/api/v1/vm.add-disk':
          return send(200, JSON.stringify({ id: '_disk1', bdf: '0000:00:06.0' }));
        case '/api/v1/vm.info':
          return send(200, JSON.stringify({ config: { payload: {} }, state }));
        case '/api/v1/vm.boot':
          return send(400);
        default:
          return send(404);
      }
    });
    await new Promise<void>((resolve) => server.listen(socket(), resolve));
    api = new ChApi(socket());
  });
  afterAll(() => server.close());

  it('treats 204, 200-with-empty-body and 200-with-JSON as success', async () => {
    await expect(api.pauseVm()).resolves.toBeUndefined();
    await expect(api.shutdownVmm()).resolves.toBeUndefined();
    await expect(api.addDisk({ path: '/x', image_type: 'Raw' })).resolves.toEqual({ id: '_disk1', bdf: '0000:00:06.0' });
  });

  it('keeps the whole error chain and surfaces its last element', async () => {
    const error = await api.resumeVm().catch((caught: unknown) => caught);
    expect(error).toBeInstanceOf(ChApiError);
    expect((error as ChApiError).status).toBe(500);
    expect((error as ChApiError).chain).toEqual(['Error from API', 'The VM could not be resumed', 'Invalid VM state transition']);
    expect((error as ChApiError).message).toMatch(/Invalid VM state transition$/);
    const empty = (await api.bootVm().catch((caught: unknown) => caught)) as ChApiError;
    expect(empty.status).toBe(400);
    expect(empty.chain).toEqual(['HTTP 400 with an empty body']);
    expect(parseErrorChain(500, 'plain text')).toEqual(['plain text']);
  });

  it('reports an unreachable VMM as status 0', async () => {
    const error = (await new ChApi(join(dir, 'missing.sock')).ping().catch((caught: unknown) => caught)) as ChApiError;
    expect(error.unreachable).toBe(true);
    expect(error.code).toBe('ENOENT');
  });

  it('checks the state after a call and reports a mismatch with the observed state', async () => {
    state = 'Running';
    await expect(expectState(api, 'Running', 'x')).resolves.toBeUndefined();
    // The call "succeeds" but vm.info does not show the expected state.
    state = 'Shutdown';
    const mismatch = (await transition(api, 'vm.reboot', async () => {}, 'Running').catch((caught: unknown) => caught)) as VmOperationError;
    expect(mismatch).toBeInstanceOf(VmOperationError);
    expect(mismatch.observedState).toBe('Shutdown');
    state = 'Paused';
    const failed = (await transition(api, 'vm.resume', () => api.resumeVm(), 'Running').catch((caught: unknown) => caught)) as VmOperationError;
    expect(failed.chain.at(-1)).toBe('Invalid VM state transition');
    expect(failed.observedState).toBe('Paused');
    expect(failed.status).toBe(500);
  });
});

// ---- hybrid vsock against a mock muxer ----------------------------------------------------------

type MuxerBehaviour = (socket: Socket, command: string) => void;

async function mockMuxer(path: string, behaviour: MuxerBehaviour): Promise<Server> {
  const server = createServer((socket) => {
    let text = '';
    const onData = (chunk: Buffer) => {
      text += chunk.toString('latin1');
      if (!text.includes('\n')) return;
      socket.off('data', onData);
      behaviour(socket, text.slice(0, text.indexOf('\n')));
    };
    socket.on('data', onData);
    socket.on('error', () => {});
  });
  await new Promise<void>((resolve) => server.listen(path, resolve));
  return server;
}

describe('hybrid vsock dialer', () => {
  it('keeps guest bytes that arrive in the same segment as the OK line', async () => {
    const path = join(dir, 'mux1.sock');
    let seenCommand = '';
    const server = await mockMuxer(path, (socket, command) => {
      seenCommand = command;
      socket.write('OK 1073741824\nhello from the guest');
      socket.end();
    });
    try {
      const socket = await dialHybridVsock(path, 1024);
      let received = '';
      socket.on('data', (chunk: Buffer) => (received += chunk.toString()));
      socket.resume();
      await new Promise((resolve) => socket.once('end', resolve));
      expect(seenCommand).toBe('CONNECT 1024');
      expect(received).toBe('hello from the guest');
    } finally {
      server.close();
    }
  });

  it('rejects with ECONNREFUSED when the muxer closes before OK (no guest listener)', async () => {
    const path = join(dir, 'mux2.sock');
    const server = await mockMuxer(path, (socket) => socket.destroy());
    try {
      const error = (await dialHybridVsock(path, 1024).catch((caught: unknown) => caught)) as VsockDialError;
      expect(error).toBeInstanceOf(VsockDialError);
      expect(error.code).toBe('ECONNREFUSED');
      expect(error.message).toMatch(/closed before OK/);
    } finally {
      server.close();
    }
  });

  it('rejects a malformed answer, a silent muxer and a missing socket', async () => {
    const bad = join(dir, 'mux3.sock');
    const silent = join(dir, 'mux4.sock');
    const servers = [await mockMuxer(bad, (socket) => socket.write('NOPE\n')), await mockMuxer(silent, () => {})];
    try {
      expect(((await dialHybridVsock(bad, 1).catch((caught: unknown) => caught)) as VsockDialError).code).toBe('EPROTO');
      expect(((await dialHybridVsock(silent, 1, { timeoutMs: 100 }).catch((caught: unknown) => caught)) as VsockDialError).code).toBe('ETIMEDOUT');
      expect(((await dialHybridVsock(join(dir, 'none.sock'), 1).catch((caught: unknown) => caught)) as VsockDialError).code).toBe('ENOENT');
    } finally {
      for (const server of servers) server.close();
    }
  });

  it('carries the guest-agent HTTP protocol through AgentClient', async () => {
    const body = JSON.stringify({ status: 'ok', protocolVersion: 1, pid: 42, uptimeMs: 5 });
    const eager = await mockMuxer(join(dir, 'mux6.sock'), (socket) => {
      socket.write(`OK 1073741826\n`);
      socket.once('data', () => socket.end(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n${body}`));
    });
    const client = new AgentClient('mock', { agent: new HybridVsockAgent(join(dir, 'mux6.sock'), 1024) });
    try {
      await expect(client.health()).resolves.toEqual({ status: 'ok', protocolVersion: 1, pid: 42, uptimeMs: 5 });
    } finally {
      client.close();
      eager.close();
    }
  });
});

#!/usr/bin/env node
// Boots the Cloud Hypervisor VM image under QEMU with software emulation (no KVM needed) and
// reaches the guest agent over virtio-serial: health, exec in the real guest kernel, and a file
// round trip. `.ci/run` runs it after the test suite (it needs `npm run build` and
// qemu-system-x86; the image is built, or reused from its cache, first).
//
// --oci boots an OCI image instead (host/images/vm-image-oci.ts): a busybox image built here with
// umoci, served by Debian's registry on loopback, pulled, turned into its bootable disk with the
// runtime from the VM image's tree, and booted with the VM image's kernel and `init=/.nestbox/init`
// — the init script, busybox, modules and socat bridge that the simulator cannot run.
//
// --code-interpreter boots the `code-interpreter` disk (host/images/vm-code-interpreter-image.ts,
// built on the VM image's tree) and checks its kernels and libraries in the real guest.
//
// Usage: node scripts/vm-smoke.mjs [--images-dir DIR] [--boot-timeout-s N] [--oci | --code-interpreter | --build-only]
// --build-only builds (or finds) the VM image and exits: `.ci/run` does that once, then boots the
// default and the OCI variant side by side (two runs must not build the same image at once).
import { execFileSync, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { join, resolve, dirname } from 'node:path';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const repo = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const { values } = parseArgs({
  options: {
    'images-dir': { type: 'string', default: '/var/tmp/nestbox-vm-images' },
    'boot-timeout-s': { type: 'string', default: '300' },
    oci: { type: 'boolean', default: false },
    'code-interpreter': { type: 'boolean', default: false },
    'build-only': { type: 'boolean', default: false },
  },
});
const { AgentClient } = await import(join(repo, 'dist/host/agent-protocol/client.js'));

const started = Date.now();
const since = () => `${((Date.now() - started) / 1000).toFixed(1)} s`;
const work = mkdtempSync('/tmp/nbx-vmsmoke-');
let qemu;

function fail(message) {
  console.error(`vm smoke: FAILED: ${message}`);
  const log = join(work, 'serial.log');
  if (existsSync(log)) console.error(`--- guest serial log (tail) ---\n${readFileSync(log, 'utf8').slice(-3000)}`);
  cleanup();
  process.exit(1);
}

function cleanup() {
  if (qemu && qemu.exitCode === null) qemu.kill('SIGKILL');
  rmSync(work, { recursive: true, force: true });
}

try {
  console.log('vm smoke: building or reusing the VM image');
  // The build's npm reaches the registry through the machine's proxy and CA settings: without
  // them each registry request fails TLS three times before npm falls back to its cache (minutes).
  const network = Object.fromEntries(
    Object.entries(process.env).filter(([name]) => /^(NODE_EXTRA_CA_CERTS|SSL_CERT_FILE|SSL_CERT_DIR|(https?|no)_proxy)$/i.test(name)),
  );
  execFileSync(process.execPath, [join(repo, 'dist/src/cli.js'), 'image', 'build', '--vm'], {
    env: { ...network, PATH: process.env.PATH, NESTBOX_DATA_DIR: join(work, 'data'), NESTBOX_IMAGES_DIR: values['images-dir'] },
    stdio: ['ignore', 'inherit', 'inherit'],
  });
  if (values['build-only']) {
    console.log(`vm smoke: image ready after ${since()} (build only)`);
    cleanup();
    process.exit(0);
  }
  const image = join(values['images-dir'], 'vm-default');
  const [kernel, initrd] = ['vmlinuz', 'initrd.img'].map((f) => join(image, f));
  let rootfs = join(image, 'rootfs.img');
  let append = 'console=ttyS0 root=/dev/vda rw panic=-1';
  let registry;
  if (values.oci) {
    const { startTestRegistry, buildTestImage, busyboxImageSpec, pushTestImage } = await import(join(repo, 'dist/host/images/oci/test-registry.js'));
    const { OciImageStore } = await import(join(repo, 'dist/host/images/oci/store.js'));
    const { readCompleteVmImage } = await import(join(repo, 'dist/host/images/vm-image.js'));
    const { ensureOciVmDisk, guestRuntimeFromVmImage, OCI_VM_INIT } = await import(join(repo, 'dist/host/images/vm-image-oci.js'));
    registry = await startTestRegistry();
    try {
      const layout = await buildTestImage(join(work, 'busybox'), busyboxImageSpec({ env: ['GREETING=hello from the image', 'PATH=/bin'], workingDir: '/srv/app' }));
      await pushTestImage(layout, `${registry.host}/smoke/busybox:1`);
      const store = new OciImageStore({ storeDir: join(work, 'oci') });
      const imageId = (await store.pull(`${registry.host}/smoke/busybox:1`)).meta.id;
      const vmImage = await readCompleteVmImage(image);
      if (!vmImage) throw new Error(`no complete VM image in ${image}`);
      const disk = await ensureOciVmDisk({ imagesDir: work, imageId, runtime: await guestRuntimeFromVmImage(image, vmImage.manifest.kernelVersion), onProgress: (line) => console.log(`vm smoke: ${line}`) });
      rootfs = disk.rootfs;
      append += ` init=${OCI_VM_INIT}`;
      console.log(`vm smoke: OCI image ${imageId} → ${disk.manifest.sizeMiB} MiB disk (modules: ${disk.manifest.kernelModules.join(', ') || 'none'})`);
    } finally {
      await registry.stop();
    }
  }
  if (values['code-interpreter']) {
    const { ensureVmCodeInterpreterImage } = await import(join(repo, 'dist/host/images/vm-code-interpreter-image.js'));
    const disk = await ensureVmCodeInterpreterImage({ imagesDir: values['images-dir'], guestAgentBundle: join(repo, 'dist/guest-agent.mjs'), ptyHelperBinary: join(repo, 'dist/nestbox-pty'), onProgress: (line) => console.log(`vm smoke: ${line}`) });
    rootfs = disk.rootfs;
  }
  for (const file of [kernel, initrd, rootfs]) if (!existsSync(file)) fail(`missing ${file}`);
  console.log(`vm smoke: image ready after ${since()}; booting under QEMU (TCG)`);

  const agentSocket = join(work, 'agent.sock');
  qemu = spawn('qemu-system-x86_64', [
    '-accel', 'tcg', '-M', 'q35', '-cpu', 'max', '-m', '1024', '-smp', '2',
    '-nographic', '-no-reboot',
    '-kernel', kernel, '-initrd', initrd,
    '-append', append,
    // -snapshot: the cached image is never written; guest writes go to a temporary overlay.
    '-drive', `file=${rootfs},format=raw,if=virtio`, '-snapshot',
    '-device', 'virtio-serial-pci',
    '-chardev', `socket,id=agent,path=${agentSocket},server=on,wait=off`,
    '-device', 'virtserialport,chardev=agent,name=nestbox.agent',
    '-serial', `file:${join(work, 'serial.log')}`, '-monitor', 'none',
  ], { stdio: ['ignore', 'ignore', 'inherit'] });
  qemu.on('exit', (code) => {
    if (code !== null && code !== 0) console.error(`vm smoke: qemu exited with ${code}`);
  });

  // The guest bridges the virtio-serial port to its agent once systemd is up; until then a
  // connection goes nowhere, so each attempt has a short timeout and a fresh connection.
  const deadline = Date.now() + Number(values['boot-timeout-s']) * 1000;
  let client;
  for (;;) {
    if (qemu.exitCode !== null) fail('qemu exited before the guest agent answered');
    if (Date.now() > deadline) fail(`no answer from the guest agent within ${values['boot-timeout-s']} s`);
    if (existsSync(agentSocket)) {
      client = new AgentClient(agentSocket);
      try {
        const health = await client.health({ timeoutMs: 3_000 });
        console.log(`vm smoke: guest agent answered after ${since()} (protocol ${health.protocolVersion})`);
        break;
      } catch {
        client.close();
      }
    }
    await new Promise((r) => setTimeout(r, 1_000));
  }

  client.close();

  // One virtio-serial port carries one connection at a time, and the guest's bridge restarts
  // whenever the agent closes its side; so every step gets its own connection, a time limit
  // and a few retries.
  async function step(name, run, limitMs = 20_000) {
    let lastError;
    for (let attempt = 1; attempt <= 5; attempt++) {
      const stepClient = new AgentClient(agentSocket);
      try {
        return await Promise.race([
          run(stepClient),
          new Promise((_, reject) => setTimeout(() => reject(new Error(`${name} took longer than ${limitMs / 1000} s`)), limitMs)),
        ]);
      } catch (error) {
        lastError = error;
        console.log(`vm smoke: ${name}: attempt ${attempt} failed (${error.message}); retrying`);
        await new Promise((r) => setTimeout(r, 1_000));
      } finally {
        stepClient.close();
      }
    }
    fail(`${name}: ${lastError?.message}`);
  }

  if (values.oci) {
    // The image's own busybox, by argv and through its /bin/sh, with the image's Env and WorkingDir.
    const release = await step('exec by argv', (c) => c.exec({ argv: ['/bin/cat', '/etc/os-release'] }));
    if (release.exitCode !== 0 || !release.stdout.includes('Nestbox test busybox')) fail(`argv exec in the image: ${JSON.stringify(release)}`);
    const shell = await step('exec by cmd', (c) => c.exec({ cmd: 'echo "$GREETING|$HOME|$(pwd)"; /bin/busybox uname -r' }));
    const [envLine, release2] = shell.stdout.trim().split('\n');
    if (envLine !== 'hello from the image|/srv/app|/srv/app') fail(`image environment in the VM: ${JSON.stringify(shell)}`);
    if (!/cloud-amd64/.test(release2 ?? '')) fail(`unexpected guest kernel "${release2}"`);
    console.log(`vm smoke: OCI image booted: kernel ${release2}, image Env and WorkingDir seen by processes`);
    // The init's other work: the vsock modules it loaded, socat (on the disk's own loader) listening.
    const init = await step('init state', (c) => c.exec({ argv: ['/bin/busybox', 'sh', '-c', 'cat /proc/modules; /bin/busybox ps -o args'] }));
    if (!/^vmw_vsock_virtio_transport /m.test(init.stdout)) fail(`the init did not load the vsock transport: ${init.stdout}`);
    if (!/socat VSOCK-LISTEN:1024/.test(init.stdout)) fail(`no socat listening on vsock port 1024: ${init.stdout}`);
    console.log('vm smoke: init loaded the vsock transport; socat listens on vsock port 1024 (QEMU has no vsock device to reach it)');
    const payload = randomBytes(256 * 1024);
    const expected = createHash('sha256').update(payload).digest('hex');
    await step('write a file', (c) => c.writeFile('/srv/app/smoke.bin', Readable.from([payload])));
    const inside = await step('hash it inside', (c) => c.exec({ argv: ['/bin/busybox', 'sha256sum', '/srv/app/smoke.bin'] }));
    if (inside.stdout.split(' ')[0] !== expected) fail('the guest sees different bytes');
    console.log(`vm smoke: 256 KiB file round trip byte-identical; total ${since()}`);
    cleanup();
    console.log('vm smoke: OK (OCI image)');
    process.exit(0);
  }

  if (values['code-interpreter']) {
    // Python starts slowly under software emulation: these steps get minutes, not seconds.
    // A short limit: the first exec after boot sometimes gets no answer at all (seen under a loaded
    // emulator, whatever the command), and a retry on a fresh connection answers at once.
    const warm = await step('python', (c) => c.exec({ cmd: 's=$(date +%s); python3 -c "print(1)" && echo "$(( $(date +%s) - s ))"', timeoutMs: 30_000 }), 40_000);
    if (warm.exitCode !== 0) fail(`python3 in the VM: ${JSON.stringify(warm)}`);
    console.log(`vm smoke: python3 starts in ${warm.stdout.trim().split('\n').pop()} s under emulation (${since()})`);
    // The kernelspec directories `jupyter kernelspec list` reads (the CLI itself imports much of
    // jupyter_client: minutes under a loaded emulator; the local image's test runs it and the kernels).
    const specs = await step('kernelspecs', (c) => c.exec({ cmd: 'for k in /usr/share/jupyter/kernels/*/kernel.json /usr/local/share/jupyter/kernels/*/kernel.json; do basename "$(dirname "$k")"; done' }));
    const names = specs.stdout.trim().split('\n').sort();
    if (names.join(',') !== 'bash,deno,ir,python3') fail(`kernelspecs in the VM: ${JSON.stringify(specs)}`);
    const tools = await step('interpreters', (c) => c.exec({ cmd: 'deno --version | head -1; R --version | head -1; python3 -c "import numpy, pandas; print(numpy.__version__)"', timeoutMs: 240_000 }), 250_000);
    if (tools.exitCode !== 0 || !/^deno \d/.test(tools.stdout)) fail(`interpreters in the VM: ${JSON.stringify(tools)}`);
    console.log(`vm smoke: code-interpreter booted: kernels ${names.join(', ')}; ${tools.stdout.trim().split('\n').join('; ')}; total ${since()}`);
    cleanup();
    console.log('vm smoke: OK (code-interpreter)');
    process.exit(0);
  }

  const exec = await step('exec', (c) => c.exec({ cmd: 'uname -r; cat /etc/debian_version; test -c /dev/kvm && echo kvm-device' }));
  if (exec.exitCode !== 0) fail(`exec failed: ${JSON.stringify(exec)}`);
  const [kernelRelease, debian] = exec.stdout.trim().split('\n');
  if (!/cloud-amd64/.test(kernelRelease)) fail(`unexpected guest kernel "${kernelRelease}"`);
  console.log(`vm smoke: exec in the guest: kernel ${kernelRelease}, Debian ${debian}${exec.stdout.includes('kvm-device') ? ', /dev/kvm present' : ''}`);

  const payload = randomBytes(256 * 1024);
  const expected = createHash('sha256').update(payload).digest('hex');
  await step('write a file', (c) => c.writeFile('/root/smoke.bin', Readable.from([payload])));
  const readBack = await step('read it back', async (c) => {
    const hash = createHash('sha256');
    for await (const chunk of await c.readFile('/root/smoke.bin')) hash.update(chunk);
    return hash.digest('hex');
  });
  if (readBack !== expected) fail('file round trip changed the bytes');
  const inside = await step('hash it inside', (c) => c.exec({ cmd: 'sha256sum /root/smoke.bin | cut -d" " -f1' }));
  if (inside.stdout.trim() !== expected) fail('the guest sees different bytes');
  console.log(`vm smoke: 256 KiB file round trip byte-identical; total ${since()}`);
  cleanup();
  console.log('vm smoke: OK');
  process.exit(0);
} catch (err) {
  fail(err instanceof Error ? err.stack ?? err.message : String(err));
}

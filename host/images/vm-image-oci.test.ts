// The parts of image VM disks that need no root and no VM: the agent-start script's quoting of
// the image's environment (values are the image author's, anything but NUL), and the checks
// that refuse an image before anything is copied.
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { agentStartScript, ensureOciVmDisk, OciImageMissingError, OciImageUnbootableError, shellQuote } from './vm-image-oci.js';

const HEX = 'a'.repeat(64);
const runtime = { nodeBinary: process.execPath, guestAgentBundle: '/nonexistent', busyboxBinary: '/bin/busybox', socatBinary: '/usr/bin/socat', librariesRoot: '/' };

describe('image VM disks', () => {
  const dir = mkdtempSync(join(tmpdir(), 'nbx-vmoci-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('quotes every environment value so the shell passes it through unchanged', () => {
    for (const value of ["it's", 'a\nb', '$HOME `id` $(id) \\ "q"', '', ' lead and trail ']) {
      expect(execFileSync('/bin/sh', ['-c', `printf '%s' ${shellQuote(value)}`], { encoding: 'utf8' })).toBe(value);
    }
    const script = agentStartScript({ GOOD: "it's $fine", HOME: '/srv/app', 'BAD-NAME': 'x' });
    expect(script).toContain(`'GOOD=it'\\''s $fine'`);
    expect(script).not.toContain('BAD-NAME');
    expect(script).toContain("cd '/srv/app'");
    // busybox sh (the one the disk runs it with) parses it.
    writeFileSync(join(dir, 'agent-start'), script);
    execFileSync('/bin/busybox', ['sh', '-n', join(dir, 'agent-start')]);
  });

  it('refuses a missing image and a root filesystem a VM cannot boot, naming the image', async () => {
    const ociStoreDir = join(dir, 'oci');
    const missing = `sha256:${'0'.repeat(64)}`;
    await expect(ensureOciVmDisk({ imagesDir: dir, ociStoreDir, imageId: missing, runtime })).rejects.toThrow(OciImageMissingError);
    await expect(ensureOciVmDisk({ imagesDir: dir, ociStoreDir, imageId: missing, runtime })).rejects.toThrow(missing);
    const rootfs = join(ociStoreDir, 'images', HEX, 'rootfs');
    mkdirSync(join(rootfs, 'bin'), { recursive: true });
    symlinkSync('/tmp', join(rootfs, 'dev'));
    writeFileSync(join(ociStoreDir, 'images', HEX, 'image.json'), JSON.stringify({ id: `sha256:${HEX}`, config: { env: [], workingDir: '' } }));
    const error = (await ensureOciVmDisk({ imagesDir: dir, ociStoreDir, imageId: `sha256:${HEX}`, runtime }).catch((caught: unknown) => caught)) as Error;
    expect(error).toBeInstanceOf(OciImageUnbootableError);
    expect(error.message).toBe(`image sha256:${HEX} cannot boot as a VM: /dev is a symbolic link (the VM mounts or writes there)`);
  });
});

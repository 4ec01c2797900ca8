// Runs once before the suite: builds (or reuses) the built-in images every integration test
// shares, so no single test pays for debootstrap or apt. The images are cached across runs
// (the code-interpreter one keyed by content, so branches with other versions never rebuild it).
import { ensureBaseImage } from '../host/images/base-image.js';
import { ensureCodeInterpreterImage } from '../host/images/code-interpreter-image.js';
import { TEST_IMAGES_DIR } from './harness.js';

export default async function setup(): Promise<void> {
  const started = Date.now();
  await ensureBaseImage({ imagesDir: TEST_IMAGES_DIR, name: 'default', onProgress: (line) => process.stderr.write(`[base image] ${line}\n`) });
  process.stderr.write(`[base image] ready in ${TEST_IMAGES_DIR} (${Date.now() - started} ms)\n`);
  const ciStarted = Date.now();
  // Its steps only (apt prints hundreds of lines; a failure quotes the last of them).
  const image = await ensureCodeInterpreterImage({ imagesDir: TEST_IMAGES_DIR, onProgress: (line) => process.stderr.write(`[code-interpreter image] ${line}\n`) });
  process.stderr.write(`[code-interpreter image] ready at ${image.rootfs} (${Date.now() - ciStarted} ms)\n`);
}

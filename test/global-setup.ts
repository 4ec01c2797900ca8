// Runs once before the suite: builds (or reuses) the base image every integration test
// shares, so no single test pays for debootstrap. The image is cached across runs.
import { ensureBaseImage } from '../host/images/base-image.js';
import { TEST_IMAGES_DIR } from './harness.js';

export default async function setup(): Promise<void> {
  const started = Date.now();
  await ensureBaseImage({ imagesDir: TEST_IMAGES_DIR, name: 'default', onProgress: (line) => process.stderr.write(`[base image] ${line}\n`) });
  process.stderr.write(`[base image] ready in ${TEST_IMAGES_DIR} (${Date.now() - started} ms)\n`);
}

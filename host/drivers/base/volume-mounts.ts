// Checks of a sandbox spec's volume mounts (issue 19), the same for every driver.
import { DriverError } from '../errors.js';
import type { SandboxSpec } from '../types.js';
import type { VolumeStore } from '../../storage/volumes.js';
import { VOLUME_ID_PATTERN, volumePathProblem } from '../../storage/volumes.js';

export const MAX_VOLUME_MOUNTS = 16;

export function validateVolumeMounts(spec: Pick<SandboxSpec, 'volumes'>, store: VolumeStore): void {
  const mounts = spec.volumes ?? [];
  const invalid = (message: string) => new DriverError('validation_failed', message);
  if (mounts.length > MAX_VOLUME_MOUNTS) throw invalid(`volumes: at most ${MAX_VOLUME_MOUNTS} mounts`);
  const paths = new Set<string>();
  for (const [index, mount] of mounts.entries()) {
    if (!VOLUME_ID_PATTERN.test(mount.volumeId)) throw invalid(`volumes[${index}].volumeId: invalid volume id "${mount.volumeId}"`);
    const pathProblem = volumePathProblem(mount.mountPath, 'mountPath');
    if (pathProblem) throw invalid(`volumes[${index}].mountPath: ${pathProblem}`);
    if (mount.subpath) {
      const subProblem = volumePathProblem(mount.subpath, 'subpath');
      if (subProblem) throw invalid(`volumes[${index}].subpath: ${subProblem}`);
    }
    const normal = '/' + mount.mountPath.split('/').filter(Boolean).join('/');
    if (paths.has(normal)) throw invalid(`volumes[${index}].mountPath: ${normal} is mounted twice`);
    paths.add(normal);
    if (!store.exists(mount.volumeId)) throw new DriverError('not_found', `volume ${mount.volumeId} is not on this host`);
  }
}

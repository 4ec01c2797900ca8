// The host agent's side of host-to-host transfers (snapshot layers; a moved sandbox's disk).
// The receiving agent pulls: the control plane tells it where the source agent is and hands it
// a token that the SOURCE signed-key scheme accepts (core/transfer-token.ts): read access to one
// snapshot chain or one stopped sandbox, for a few minutes. The source's export routes accept
// that token instead of the host secret, which never leaves the control plane. Bytes stream
// from the source's tar through HTTP into the receiver's tar; nothing is held in memory.
import http from 'node:http';
import https from 'node:https';
import type { Driver, SandboxSpec } from '../drivers/types.js';
import { DriverError } from '../drivers/errors.js';
import type { Logger } from '../../core/logger.js';
import { TRANSFER_TOKEN_HEADER, verifyTransferToken } from '../../core/transfer-token.js';
import { DISK_INFO_HEADER, SandboxDiskInfoHeader, SNAPSHOT_PARENTS_HEADER, SnapshotIdParam, type HostSandboxImportRequest, type HostSnapshotImportRequest } from '../protocol/schemas.js';

/** `GET /v1/snapshots/{id}/export` and `GET /v1/sandboxes/{id}/export`: the routes a peer may call with a token. */
export const EXPORT_ROUTE = /^\/v1\/(snapshots|sandboxes)\/([A-Za-z0-9][A-Za-z0-9_.-]{0,63})\/export$/;

/** A failure with the status the answer should carry. */
export class TransferError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export interface TransferContext {
  hostId: string;
  secret: string;
  driver: Driver;
  logger: Logger;
}

/** Serves an export to a peer host agent holding a valid token for exactly this data. */
export async function serveExport(ctx: TransferContext, req: http.IncomingMessage, res: http.ServerResponse, kind: 'snapshots' | 'sandboxes', id: string): Promise<void> {
  if (req.method !== 'GET') throw new TransferError(405, 'method_not_allowed', `${req.method} not allowed on an export`);
  const raw = req.headers[TRANSFER_TOKEN_HEADER];
  const grant = typeof raw === 'string' ? verifyTransferToken(ctx.secret, ctx.hostId, raw) : undefined;
  if (!grant) throw new TransferError(401, 'unauthorized', 'missing, expired or invalid transfer token');
  const driver = ctx.driver;
  if (kind === 'sandboxes') {
    if (grant.kind !== 'sandbox' || grant.id !== id) throw new TransferError(403, 'forbidden', `the transfer token does not cover sandbox ${id}`);
    if (!driver.exportSandbox) throw new TransferError(501, 'not_supported', `the ${driver.name} driver cannot send sandboxes to other hosts`);
    await driver.exportSandbox(id, (info) => {
      res.writeHead(200, { 'content-type': 'application/x-tar', [DISK_INFO_HEADER]: JSON.stringify(info) });
      return res;
    });
    return;
  }
  if (grant.kind !== 'snapshot') throw new TransferError(403, 'forbidden', `the transfer token does not cover snapshot ${id}`);
  // The token names the top of a chain; its parents may be fetched with it too.
  if (grant.id !== id) {
    const top = (await driver.listSnapshots()).find((s) => s.snapshotId === grant.id);
    if (!top?.layers.includes(id)) throw new TransferError(403, 'forbidden', `the transfer token does not cover snapshot ${id}`);
  }
  if (!driver.exportSnapshot) throw new TransferError(501, 'not_supported', `the ${driver.name} driver cannot send snapshots to other hosts`);
  await driver.exportSnapshot(id, (parents) => {
    res.writeHead(200, { 'content-type': 'application/x-tar', [SNAPSHOT_PARENTS_HEADER]: parents.join(',') });
    return res;
  });
}

/** GET from the source agent with the token; a non-200 answer becomes an error carrying its message. */
function fetchExport(sourceUrl: string, path: string, token: string): Promise<http.IncomingMessage> {
  const url = new URL(path, sourceUrl.endsWith('/') ? sourceUrl : `${sourceUrl}/`);
  const get = url.protocol === 'https:' ? https.get : http.get;
  return new Promise((resolve, reject) => {
    const req = get(url, { headers: { [TRANSFER_TOKEN_HEADER]: token } }, (res) => {
      if (res.statusCode === 200) return resolve(res);
      const chunks: Buffer[] = [];
      res.on('data', (d: Buffer) => chunks.length < 64 && chunks.push(d));
      res.on('end', () => {
        let message = Buffer.concat(chunks).toString('utf8').slice(0, 2000);
        let code = 'host_unavailable';
        try {
          const body = JSON.parse(message) as { error?: { code?: string; message?: string } };
          message = body.error?.message ?? message;
          code = body.error?.code ?? code;
        } catch {
          /* not JSON: keep the text */
        }
        reject(new TransferError(res.statusCode === 404 ? 404 : res.statusCode === 409 ? 409 : 502, code, `the source host answered ${res.statusCode} to ${url.pathname}: ${message}`));
      });
    });
    req.on('error', (error) => reject(new TransferError(502, 'host_unavailable', `the source host at ${url.origin} could not be reached: ${error.message}`)));
  });
}

/**
 * `POST /v1/snapshots/{id}/import`: pulls the snapshot and every parent in its chain this host
 * lacks. Parents first go in after their child; if one fails, the snapshots this call took in
 * are removed again, so the host never holds a chain it cannot mount.
 */
export async function importSnapshotChain(ctx: TransferContext, snapshotId: string, body: HostSnapshotImportRequest): Promise<string[]> {
  const driver = ctx.driver;
  if (!driver.importSnapshot) throw new TransferError(501, 'not_supported', `the ${driver.name} driver cannot take snapshots from other hosts`);
  const have = new Set((await driver.listSnapshots()).map((s) => s.snapshotId));
  const taken: string[] = [];
  try {
    let pending = [snapshotId];
    for (let guard = 0; pending.length && guard < 256; guard++) {
      const id = pending.shift()!;
      if (have.has(id)) continue;
      const res = await fetchExport(body.sourceUrl, `v1/snapshots/${encodeURIComponent(id)}/export`, body.token);
      const parents = String(res.headers[SNAPSHOT_PARENTS_HEADER] ?? '').split(',').filter(Boolean);
      for (const parent of parents) if (!SnapshotIdParam.safeParse(parent).success) throw new TransferError(502, 'host_unavailable', `the source host named an invalid parent snapshot "${parent}"`);
      await driver.importSnapshot(id, res);
      have.add(id);
      taken.push(id);
      pending = [...pending, ...parents.filter((p) => !have.has(p))];
    }
  } catch (error) {
    for (const id of taken.reverse()) await driver.deleteSnapshot(id).catch((e: unknown) => ctx.logger.warn({ snapshotId: id }, `import: removing ${id} after a failed chain import failed: ${String(e)}`));
    throw error;
  }
  return taken;
}

/** `POST /v1/sandboxes/{id}/import`: pulls a stopped sandbox's disk from the source host. */
export async function importSandbox(ctx: TransferContext, sandboxId: string, body: HostSandboxImportRequest): Promise<{ id: string; status: string }> {
  const driver = ctx.driver;
  if (!driver.importSandbox) throw new TransferError(501, 'not_supported', `the ${driver.name} driver cannot take sandboxes from other hosts`);
  if (body.spec.id !== sandboxId) throw new TransferError(400, 'validation_failed', 'spec.id: does not match the sandbox in the path');
  const existing = await driver.get(sandboxId);
  if (existing?.status === 'stopped') return { id: existing.id, status: existing.status }; // a retry after it completed
  const res = await fetchExport(body.sourceUrl, `v1/sandboxes/${encodeURIComponent(sandboxId)}/export`, body.token);
  let header: unknown;
  try {
    header = JSON.parse(String(res.headers[DISK_INFO_HEADER] ?? 'null'));
  } catch {
    header = null;
  }
  const info = SandboxDiskInfoHeader.safeParse(header);
  if (!info.success) {
    res.destroy();
    throw new TransferError(502, 'host_unavailable', `the source host sent no valid ${DISK_INFO_HEADER} header`);
  }
  try {
    const runtime = await driver.importSandbox(body.spec as SandboxSpec, info.data, res);
    return { id: runtime.id, status: runtime.status };
  } catch (error) {
    res.destroy();
    if (error instanceof DriverError) throw error;
    throw new TransferError(502, 'host_unavailable', `taking in sandbox ${sandboxId} from the source host failed: ${error instanceof Error ? error.message : String(error)}`);
  }
}

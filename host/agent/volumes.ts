// The host agent's volume routes (issue 19): the control plane creates, measures and deletes a
// volume's file system on the host that holds it (host/storage/volumes.ts).
//   PUT    /v1/volumes/{id}   {sizeBytes}  → 200 {id, sizeBytes, usedBytes}  (idempotent)
//   GET    /v1/volumes/{id}                → 200 {id, sizeBytes, usedBytes}
//   DELETE /v1/volumes/{id}                → 204 (idempotent; the control plane refuses a mounted one)
import type http from 'node:http';
import type { Driver } from '../drivers/types.js';
import { DriverError } from '../drivers/errors.js';
import { HostVolumeCreate, VolumeIdParam } from '../protocol/schemas.js';
import { KeyedLocks } from '../keyed-locks.js';
import type { VolumeStore } from '../storage/volumes.js';
import { handleVolumeFiles } from './volume-files.js';

const MAX_BODY = 64 * 1024;
const locks = new KeyedLocks();

function send(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

async function readBody(req: http.IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY) throw new DriverError('validation_failed', 'body: too large');
    chunks.push(chunk as Buffer);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
  } catch {
    throw new DriverError('validation_failed', 'body: not valid JSON');
  }
}

async function info(store: VolumeStore, id: string) {
  const usage = await store.usage(id);
  return { id, sizeBytes: usage.sizeBytes, usedBytes: usage.usedBytes };
}

export async function handleVolumeRoute(driver: Driver, parts: string[], req: http.IncomingMessage, res: http.ServerResponse, url: URL): Promise<void> {
  const store = driver.volumes;
  if (!store) throw new DriverError('not_supported', `the ${driver.name} driver has no volumes`);
  const parsed = VolumeIdParam.safeParse(parts[2]);
  if (!parsed.success) throw new DriverError('validation_failed', `volume id: ${parsed.error.issues[0]!.message}`);
  const id = parsed.data;
  if (parts.length >= 4 && parts[3] === 'files') {
    if (!store.exists(id)) throw new DriverError('not_found', `volume ${id} is not on this host`);
    await store.ensure(id);
    return handleVolumeFiles(store.dataDir(id), parts.slice(4), req, res, url);
  }
  if (parts.length !== 3) throw new DriverError('not_found', `no route ${url.pathname}`);
  if (req.method === 'PUT') {
    const body = HostVolumeCreate.safeParse(await readBody(req));
    if (!body.success) throw new DriverError('validation_failed', `${body.error.issues[0]!.path.join('.') || 'body'}: ${body.error.issues[0]!.message}`);
    await locks.run(id, () => store.ensure(id, body.data.sizeBytes));
    return send(res, 200, await info(store, id));
  }
  if (req.method === 'GET') {
    if (!store.exists(id)) throw new DriverError('not_found', `volume ${id} is not on this host`);
    return send(res, 200, await info(store, id));
  }
  if (req.method === 'DELETE') {
    await locks.run(id, () => store.destroy(id));
    res.writeHead(204).end();
    return;
  }
  throw new DriverError('validation_failed', `${req.method} not allowed on ${url.pathname}`);
}

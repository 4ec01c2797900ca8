// The Node adapter for envd's Connect services: connect-node's connectNodeAdapter, plus one
// thing it gets wrong for a server facing untrusted clients. connect-es reports a request body
// that is not a valid protobuf message as `internal` (HTTP 500: "parse binary: premature EOF")
// although it is the client's mistake; JSON bodies that fail to parse are `invalid_argument`.
// So unary binary requests are decoded here first, and a malformed one is answered 400
// invalid_argument in Connect's error shape before the RPC runs. Everything else (protocols,
// streaming, compression, timeouts) is connect-es's own code. Likewise a compressed body that
// does not decompress is the client's mistake; connect-es calls some of those (brotli's) internal.
import type http from 'node:http';
import { fromBinary } from '@bufbuild/protobuf';
import { Code, ConnectError, createConnectRouter, createContextKey, createContextValues, type ConnectRouter, type HandlerContext } from '@connectrpc/connect';
import type { Compression } from '@connectrpc/connect/protocol';
import { compressionBrotli, compressionGzip, universalRequestFromNodeRequest, universalResponseToNodeResponse } from '@connectrpc/connect-node';
import type { ErrorLog } from '../../../core/logger.js';

/** Largest request message accepted (connect-es's default is 4 GiB). Unary envd messages are small; stdin chunks are well below. */
export const MAX_RPC_MESSAGE_BYTES = 16 * 1024 * 1024;

/**
 * Longest client deadline honoured (24 h, the native API's command limit). connect-es arms a
 * timer with the deadline, and past 2^31 ms a Node timer fires at once: a Connect-Timeout-Ms
 * of 9999999999 (10 digits are allowed) cancelled the call immediately. Longer Connect
 * deadlines are shortened to this; other protocols' are refused (maxTimeoutMs).
 */
export const MAX_RPC_DEADLINE_MS = 86_400_000;

/**
 * A compression whose decompression failures are invalid_argument (400): the bytes came from
 * the client, so a body that will not decompress is never the server's fault. Oversized output
 * stays resource_exhausted.
 */
function clientFacing(compression: Compression): Compression {
  return {
    name: compression.name,
    compress: (bytes) => compression.compress(bytes),
    decompress: (bytes, readMaxBytes) =>
      compression.decompress(bytes, readMaxBytes).catch((err: unknown) => {
        const error = ConnectError.from(err);
        if (error.code !== Code.Internal) throw error;
        throw new ConnectError(`body: does not decompress as ${compression.name}`, Code.InvalidArgument, undefined, undefined, err);
      }),
  };
}

const COMPRESSIONS = [compressionGzip, compressionBrotli].map(clientFacing);

/** How an RPC cuts its HTTP connection instead of ending its stream (see dropConnection). */
const DROP_CONNECTION = createContextKey<(() => void) | undefined>(undefined, { description: 'drop the HTTP connection of this RPC' });

/**
 * End an RPC the way envd's does when its sandbox dies under it: the connection breaks, with no
 * end-of-stream message. The SDK reads a broken connection ("terminated") as a possible kill,
 * probes /health, and on its 502 reports "The sandbox was killed or reached its end of life
 * while the request was in flight" (a TimeoutError), which a Connect error would not give.
 */
export function dropConnection(ctx: HandlerContext): void {
  ctx.values.get(DROP_CONNECTION)?.();
}
const UNARY_BINARY = /^application\/proto$/i;

/** Connect's unary error: HTTP status from the code, body `{code, message}`. */
function writeConnectError(res: http.ServerResponse, status: number, code: string, message: string): void {
  const body = JSON.stringify({ code, message });
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

async function readBody(req: http.IncomingMessage, max: number): Promise<Buffer | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > max) return undefined;
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

export function envdConnectHandler(routes: (router: ConnectRouter) => void, log: ErrorLog) {
  const router = createConnectRouter({ acceptCompression: COMPRESSIONS, readMaxBytes: MAX_RPC_MESSAGE_BYTES, maxTimeoutMs: MAX_RPC_DEADLINE_MS });
  routes(router);
  const handlers = new Map(router.handlers.map((h) => [h.requestPath, h]));

  return async (req: http.IncomingMessage, res: http.ServerResponse): Promise<void> => {
    const handler = handlers.get((req.url ?? '').split('?', 2)[0]);
    if (!handler) return writeConnectError(res, 404, 'unimplemented', `no RPC ${(req.url ?? '').split('?', 2)[0]}`);
    const deadline = req.headers['connect-timeout-ms'];
    if (typeof deadline === 'string' && /^\d{1,10}$/.test(deadline) && Number(deadline) > MAX_RPC_DEADLINE_MS) req.headers['connect-timeout-ms'] = String(MAX_RPC_DEADLINE_MS);
    let body: AsyncIterable<Uint8Array> | undefined;
    if (handler.method.methodKind === 'unary' && req.method === 'POST' && UNARY_BINARY.test(String(req.headers['content-type'] ?? ''))) {
      let bytes: Uint8Array | undefined;
      try {
        bytes = await readBody(req, MAX_RPC_MESSAGE_BYTES);
      } catch {
        // The client went away mid-body: nobody is left to answer.
        res.destroy();
        return;
      }
      if (!bytes) return writeConnectError(res, 413, 'resource_exhausted', `body: larger than ${MAX_RPC_MESSAGE_BYTES} bytes`);
      const raw = bytes;
      const encoding = String(req.headers['content-encoding'] ?? 'identity').toLowerCase();
      try {
        const compression = COMPRESSIONS.find((c) => c.name === encoding);
        const message = compression ? await compression.decompress(raw, MAX_RPC_MESSAGE_BYTES) : raw;
        // Unknown encodings are connect-es's to refuse (unimplemented); only the message is checked here.
        if (compression || encoding === 'identity') fromBinary(handler.method.input, message);
      } catch (err) {
        const reason = err instanceof ConnectError ? err.rawMessage : err instanceof Error ? err.message : String(err);
        return writeConnectError(res, 400, 'invalid_argument', `body: is not a valid ${handler.method.input.typeName} protobuf message (${reason})`);
      }
      // connect-es reads the (still compressed) bytes again from this iterable.
      body = (async function* () {
        yield raw;
      })();
    }
    const uReq = universalRequestFromNodeRequest(req, res, undefined, createContextValues().set(DROP_CONNECTION, () => res.destroy()));
    if (body) uReq.body = body;
    try {
      const uRes = await handler(uReq);
      await universalResponseToNodeResponse(uRes, res);
    } catch (reason) {
      // Aborted: the client went away; destroyed: the RPC dropped the connection on purpose.
      if (ConnectError.from(reason).code === Code.Aborted || res.destroyed) return;
      log.error({ err: reason, rpc: `${handler.service.typeName}/${handler.method.name}` }, `e2b envd: rpc ${handler.method.name} of ${handler.service.typeName} failed: ${reason instanceof Error ? reason.message : String(reason)}`);
      if (!res.headersSent) writeConnectError(res, 500, 'internal', 'internal error; the server log has the details');
      else res.destroy();
    }
  };
}

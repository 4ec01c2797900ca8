// Reads a failed answer of a host agent or guest agent into a NestboxError, with the one decoder
// of core (decodeErrorBody), so every hop maps codes the same way.
import type { IncomingMessage } from 'node:http';
import { decodeErrorBody, MAX_ERROR_BODY_BYTES, type NestboxError } from '../../core/errors.js';

/** Consumes (at most MAX_ERROR_BODY_BYTES of) the response and decodes it. */
export async function errorFromResponse(res: IncomingMessage, who?: string): Promise<NestboxError> {
  const chunks: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of res) {
      chunks.push(chunk as Buffer);
      size += (chunk as Buffer).length;
      if (size >= MAX_ERROR_BODY_BYTES) {
        res.destroy();
        break;
      }
    }
  } catch {
    // A cut-off error body still has a status to go by.
  }
  return decodeErrorBody(res.statusCode ?? 502, Buffer.concat(chunks).subarray(0, MAX_ERROR_BODY_BYTES).toString('utf8'), who);
}

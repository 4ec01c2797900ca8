// Test helpers for the file routes: JSON calls against an in-process agent and a busboy-based
// reader for multipart answers. Only imported by tests.
import busboy from 'busboy';
import type { IncomingMessage } from 'node:http';
import { Readable } from 'node:stream';
import type { AgentClient } from '../agent-protocol/client.js';

export interface CallResult {
  status: number;
  headers: IncomingMessage['headers'];
  raw: Buffer;
  json: () => any; // eslint-disable-line @typescript-eslint/no-explicit-any
}

export async function bodyOf(response: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of response) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

export async function call(client: AgentClient, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<CallResult> {
  const payload = body === undefined ? undefined : Buffer.isBuffer(body) || body instanceof Readable ? body : JSON.stringify(body);
  const allHeaders = { ...(typeof payload === 'string' ? { 'content-type': 'application/json' } : {}), ...headers };
  const response = await client.request({ method, path, headers: allHeaders, body: payload as Buffer | string | Readable | undefined });
  const raw = await bodyOf(response);
  return { status: response.statusCode ?? 0, headers: response.headers, raw, json: () => JSON.parse(raw.toString('utf8')) };
}

export function q(params: Record<string, string | number | boolean>): string {
  return new URLSearchParams(Object.entries(params).map(([key, value]) => [key, String(value)])).toString();
}

export interface ParsedPart {
  name: string;
  filename: string | undefined;
  contentType: string;
  data: Buffer;
}

/** Parses a multipart/form-data body the way Daytona's SDK does (busboy, preservePath). */
export function parseMultipart(body: Buffer, contentType: string): Promise<ParsedPart[]> {
  return new Promise((resolve, reject) => {
    const parts: ParsedPart[] = [];
    const parser = busboy({ headers: { 'content-type': contentType }, preservePath: true });
    parser.on('file', (name, stream, info) => {
      const chunks: Buffer[] = [];
      stream.on('data', (chunk: Buffer) => chunks.push(chunk));
      stream.on('end', () => parts.push({ name, filename: info.filename, contentType: info.mimeType, data: Buffer.concat(chunks) }));
    });
    parser.on('close', () => resolve(parts));
    parser.on('error', reject);
    parser.end(body);
  });
}

export interface UploadPart {
  field: string;
  value: string | Buffer;
  filename?: string;
}

/** Builds a multipart/form-data body from text fields and file parts, in order. */
export function multipartBody(parts: UploadPart[], boundary = `----test${Math.random().toString(16).slice(2)}`): { body: Buffer; contentType: string } {
  const chunks: Buffer[] = [];
  for (const part of parts) {
    if (part.filename === undefined) {
      chunks.push(Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="${part.field}"\r\n\r\n`), Buffer.from(part.value), Buffer.from('\r\n'));
    } else {
      chunks.push(
        Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="${part.field}"; filename="${part.filename}"\r\nContent-Type: text/plain\r\n\r\n`),
        Buffer.from(part.value),
        Buffer.from('\r\n'),
      );
    }
  }
  chunks.push(Buffer.from(`--${boundary}--\r\n`));
  return { body: Buffer.concat(chunks), contentType: `multipart/form-data; boundary=${boundary}` };
}

/** Daytona's bulk-upload form: files[i].path then files[i].file for each file. */
export function daytonaUploadBody(files: { path: string; data: string | Buffer }[]): { body: Buffer; contentType: string } {
  return multipartBody(
    files.flatMap((file, index) => [
      { field: `files[${index}].path`, value: file.path },
      { field: `files[${index}].file`, value: file.data, filename: 'ignored-name.txt' },
    ]),
  );
}

// Reading and validating small JSON request bodies. File bodies never come through here: they
// are streamed (see files.ts).
import type { IncomingMessage } from 'node:http';
import type { z } from 'zod';
import { discardableBody } from '../agent-protocol/request-body.js';
import { AgentHttpError, validationFailed } from './errors.js';

/** Formats a zod issue path the way a developer would write it: `env.FOO`, `argv[2]`. */
function formatIssuePath(path: readonly PropertyKey[]): string {
  let text = '';
  for (const segment of path) {
    if (typeof segment === 'number') text += `[${segment}]`;
    else text += text === '' ? String(segment) : `.${String(segment)}`;
  }
  return text;
}

/** One line per problem, each starting with the field it is about. */
export function describeZodError(error: z.ZodError): string {
  return error.issues
    .map((issue) => {
      if (issue.code === 'unrecognized_keys') {
        const prefix = formatIssuePath(issue.path);
        return issue.keys.map((key) => `${prefix ? `${prefix}.` : ''}${key}: unknown field`).join('; ');
      }
      return `${formatIssuePath(issue.path) || 'body'}: ${issue.message}`;
    })
    .join('; ');
}

export async function readBodyBuffer(req: IncomingMessage, limitBytes: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let total = 0;
  // Leaving this loop at the limit destroys what it iterates: not the request itself, whose
  // remaining bytes must still be read for the 413 to reach the client (request-body.ts).
  for await (const chunk of discardableBody(req)) {
    const buffer = chunk as Buffer;
    total += buffer.length;
    if (total > limitBytes) {
      throw new AgentHttpError(413, 'payload_too_large', `body: larger than the limit of ${limitBytes} bytes`);
    }
    chunks.push(buffer);
  }
  return Buffer.concat(chunks);
}

export async function readJsonBody<T>(req: IncomingMessage, schema: z.ZodType<T>, limitBytes: number): Promise<T> {
  const raw = await readBodyBuffer(req, limitBytes);
  if (raw.length === 0) throw validationFailed('body', 'required (a JSON object)');
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw.toString('utf8'));
  } catch (error) {
    throw validationFailed('body', `invalid JSON: ${(error as Error).message}`);
  }
  const result = schema.safeParse(parsed);
  if (!result.success) {
    throw new AgentHttpError(400, 'validation_failed', describeZodError(result.error));
  }
  return result.data;
}

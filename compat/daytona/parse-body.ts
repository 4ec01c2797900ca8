// A Daytona request body checked by its zod schema: the first problem becomes core's
// validation_failed naming the field (rendered as Daytona's 400 by errors.ts).
import type { z } from 'zod';
import { NestboxError } from '../../core/errors.js';

export function parseBody<T>(schema: z.ZodType<T>, body: unknown): T {
  const parsed = schema.safeParse(body ?? {});
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const field = issue.path.join('.') || 'body';
    throw new NestboxError('validation_failed', `${field}: ${issue.message}`, { field });
  }
  return parsed.data;
}

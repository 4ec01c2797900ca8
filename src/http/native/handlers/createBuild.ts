import type { NativeHandler } from '../context.js';
import { principalOf } from '../context.js';
import { jsonBody } from '../guest-io.js';
import { renderBuild } from '../render.js';
import { errors, NestboxError } from '../../../../core/errors.js';
import { contextObjectKey } from '../../../../core/object-store.js';
import { BuildSpecError, type BuildSpec } from '../../../../core/images/build-spec.js';
import { parseDockerfile } from '../../../../core/images/dockerfile.js';
import { parseBuildSteps } from '../../../../core/images/steps-json.js';
import type { ImageBuild } from '../../../../core/images/types.js';
import type { EgressPolicy } from '../../../../core/types.js';

export interface CreateBuildBody {
  name: string;
  tags?: string[];
  dockerfile?: string;
  from?: string;
  steps?: unknown[];
  stages?: unknown[];
  contexts?: string[];
  buildArgs?: Record<string, string>;
  ignore?: string[];
  noCache?: boolean;
  cpu?: number;
  memoryMiB?: number;
  diskGiB?: number;
  timeoutSeconds?: number;
  readyTimeoutSeconds?: number;
  egress?: EgressPolicy;
  credentials?: { username: string; password: string };
}

/** A Dockerfile or the JSON steps, as the one BuildSpec the engine runs (a 400 naming the line otherwise). */
export function specOfBuildRequest(body: CreateBuildBody): BuildSpec {
  const contexts = (body.contexts ?? []).map(contextObjectKey);
  const hasSteps = body.steps !== undefined || body.stages !== undefined || body.from !== undefined;
  if (body.dockerfile !== undefined && hasSteps) throw errors.validation('dockerfile', 'give either a dockerfile or steps, not both');
  if (body.dockerfile === undefined && !hasSteps) throw errors.validation('dockerfile', 'a build needs a dockerfile or steps');
  try {
    if (body.dockerfile !== undefined) return parseDockerfile(body.dockerfile, { contexts, args: body.buildArgs, ignore: body.ignore });
    return parseBuildSteps({ from: body.from, steps: body.steps ?? [], stages: body.stages, args: body.buildArgs, ignore: body.ignore, contexts });
  } catch (err) {
    if (err instanceof BuildSpecError) throw new NestboxError('validation_failed', `${err.field}: ${err.message}`, { field: err.field, ...(err.line !== undefined ? { line: err.line } : {}) });
    throw err;
  }
}

export const createBuild: NativeHandler = async (ctx) => {
  const body = jsonBody<CreateBuildBody>(ctx);
  const principal = principalOf(ctx);
  const spec = specOfBuildRequest(body);
  const { builds, idempotency } = ctx.services;
  const build = await idempotency.run<ImageBuild>(
    principal.organizationId,
    ctx.req.get('idempotency-key'),
    'createBuild',
    body,
    () => builds.create(principal, { ...body, spec }),
    (b) => ({ buildId: b.id }),
    async (stored) => builds.get(principal, (stored as { buildId: string }).buildId),
  );
  ctx.res.status(202).json(renderBuild(build));
};

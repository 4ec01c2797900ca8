import type { Request, Response } from 'express';
import type { Context } from 'openapi-backend';
import type { Principal } from '../../../core/types.js';
import type { Services } from '../../services.js';

/** What every native operation handler receives: the validated request, the caller, and core. */
export interface NativeContext {
  api: Context;
  req: Request;
  res: Response;
  /** Undefined only on operations whose spec says `security: []`. */
  principal: Principal | undefined;
  services: Services;
}

export type NativeHandler = (ctx: NativeContext) => Promise<void>;

export function sandboxIdOf(ctx: NativeContext): string {
  return String(ctx.api.request.params.sandboxId);
}

export function principalOf(ctx: NativeContext): Principal {
  if (!ctx.principal) throw new Error('operation declared without security used the principal');
  return ctx.principal;
}

/** Query values as a list, whatever the client sent (`?a=1` or `?a=1&a=2`). */
export function queryList(ctx: NativeContext, name: string): string[] {
  const v = ctx.req.query[name];
  if (v === undefined) return [];
  return (Array.isArray(v) ? v : [v]).map(String);
}

export function queryString(ctx: NativeContext, name: string): string | undefined {
  const v = ctx.req.query[name];
  return v === undefined ? undefined : String(Array.isArray(v) ? v[0] : v);
}

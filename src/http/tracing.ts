// The control plane's server span of each HTTP request (tracing on only: createApp installs
// this middleware only then). Everything the request does runs in it, so the host-agent calls
// it makes (host/protocol/client.ts) and the lifecycle operation it runs are its children.
import type { NextFunction, Request, Response } from 'express';
import { serveInSpan } from '../../core/tracing.js';
import { HEARTBEAT_PATH } from '../../host/protocol/schemas.js';
import { requestNotes } from './request-id.js';

/** The front door a path belongs to: the span's route until the request is routed. */
function frontDoorOf(path: string): string {
  const match = /^\/(api\/v1|daytona|e2b)(?=\/|$)/.exec(path);
  return match ? `/${match[1]}` : '/';
}

export function traceRequests() {
  return (req: Request, res: Response, next: NextFunction): void => {
    // Host agents' heartbeats are not traced: a root span every two seconds per host says nothing.
    if (req.path === HEARTBEAT_PATH) return next();
    const door = frontDoorOf(req.path);
    serveInSpan(req, res, door, {}, () => next(), (span) => {
      // Named by the operation (native operationId) or the compat router's route pattern, never the raw path.
      const notes = requestNotes(req);
      const pattern = (req.route as { path?: unknown } | undefined)?.path;
      const route = notes?.operation ?? (typeof pattern === 'string' ? `${door}${pattern}` : undefined);
      if (route) {
        span.updateName(`${req.method} ${route}`);
        span.setAttribute('http.route', route);
      }
      if (notes?.organizationId) span.setAttribute('nestbox.organization.id', notes.organizationId);
      if (notes?.sandboxId) span.setAttribute('nestbox.sandbox.id', notes.sandboxId);
    });
  };
}

// The web dashboard (dashboard/, bundled by Vite into dist/dashboard by `npm run build`): a
// single-page app that is a client of the native API like any other, so this module only serves
// files. Hashed assets (/assets/<name>-<hash>.js) never change under their name and are cached
// for a year; index.html is revalidated on every load so a new build is picked up at once. Any
// other page path a browser asks for (GET/HEAD accepting text/html, e.g. /sandboxes/<id> on
// reload) gets index.html and the app routes it. Paths of the APIs and other front doors are
// never answered here, whatever the mount order, so they keep their own JSON 404s.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import express, { type NextFunction, type Request, type RequestHandler, type Response } from 'express';
import { projectPath } from '../paths.js';

/** Path prefixes that belong to something else (APIs, hosted ports, metrics, MCP, the API reference). */
const NOT_THE_DASHBOARD = /^\/(api|daytona|e2b|p|metrics|mcp|docs|internal)(\/|$)/;

/**
 * Where the page may load from and talk to: only this server. `connect-src 'self'` covers the
 * API's fetches and the terminal's same-origin WebSocket; xterm.js styles its DOM at run time,
 * hence 'unsafe-inline' for styles (never for scripts).
 */
const CONTENT_SECURITY_POLICY = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "img-src 'self' data: blob:",
  "connect-src 'self'",
  "font-src 'self' data:",
  "object-src 'none'",
  "base-uri 'none'",
  "frame-ancestors 'none'",
  "form-action 'self'",
].join('; ');

function pageHeaders(res: Response): void {
  res.setHeader('Cache-Control', 'no-cache');
  res.setHeader('Content-Security-Policy', CONTENT_SECURITY_POLICY);
  res.setHeader('X-Content-Type-Options', 'nosniff');
  res.setHeader('Referrer-Policy', 'no-referrer');
}

const NOT_BUILT_PAGE = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Nestbox: dashboard not built</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 40rem; margin: 3rem auto; padding: 0 1rem">
<h1>The dashboard is not built</h1>
<p>This server has no <code>dist/dashboard/</code>. Run <code>npm run build</code> in the Nestbox checkout, then reload this page.</p>
<p>The API works without it: <code>/api/v1</code>, reference at <a href="/docs">/docs</a>.</p>
</body></html>
`;

/**
 * A browser loading a page: it names text/html in Accept (a script, a fetch or curl's `*\/*` does
 * not), and not for a missing hashed asset (a stale build's file is a 404, not the app).
 */
function wantsPage(req: Request): boolean {
  return (req.headers.accept ?? '').includes('text/html') && !req.path.startsWith('/assets/');
}

export function dashboardHandler(dir = projectPath('dist/dashboard')): RequestHandler {
  const indexFile = join(dir, 'index.html');
  const files = express.static(dir, {
    index: false,
    redirect: false,
    setHeaders(res, path) {
      if (path.startsWith(join(dir, 'assets') + '/')) res.setHeader('Cache-Control', 'public, max-age=31536000, immutable');
      else pageHeaders(res);
    },
  });
  return (req: Request, res: Response, next: NextFunction) => {
    if ((req.method !== 'GET' && req.method !== 'HEAD') || NOT_THE_DASHBOARD.test(req.path)) return next();
    // Looked up per request (one stat): a server started before `npm run build` serves the build once it exists.
    if (!existsSync(indexFile)) {
      if (!wantsPage(req)) return next();
      res.status(503).setHeader('Cache-Control', 'no-store');
      return void res.type('html').send(NOT_BUILT_PAGE);
    }
    files(req, res, (err?: unknown) => {
      if (err) return next(err);
      if (!wantsPage(req)) return next();
      pageHeaders(res);
      res.sendFile(indexFile, { headers: { 'Cache-Control': 'no-cache' } }, (sendErr) => {
        if (sendErr && !res.headersSent) next(sendErr);
      });
    });
  };
}

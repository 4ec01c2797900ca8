import { existsSync } from 'node:fs';
import express, { type Request, type Response, type Router } from 'express';
import { NestboxError } from '../../core/errors.js';
import { projectPath } from '../paths.js';
import { renderNativeError } from './native/router.js';

/**
 * The rendered API reference at `/docs`: Scalar's browser bundle (copied into dist/docs/ by
 * `npm run build`, scripts/copy-api-reference.mjs) rendering the native spec the server already
 * serves at `/api/v1/openapi.yaml`. Public like the spec itself: reading the reference needs no
 * key (its "try it" client sends whatever key the reader types, to this same server).
 */
export const API_REFERENCE_BUNDLE = (): string => projectPath('dist/docs/standalone.js');

/**
 * Scalar's options, chosen so that the page loads nothing from anywhere but this server: no
 * font CDN, no telemetry, no Scalar agent/chat, no request proxy (requests go straight to the
 * spec's server, `/api/v1` on this origin), no developer toolbar (it offers sharing through
 * scalar.com).
 */
export const SCALAR_CONFIGURATION = {
  url: '/api/v1/openapi.yaml',
  slug: 'native',
  title: 'Nestbox native API',
  withDefaultFonts: false,
  telemetry: false,
  agent: { disabled: true },
  // An empty string, not undefined: undefined lets Scalar fall back to its own hosted proxy.
  proxyUrl: '',
  showDeveloperTools: 'never',
  documentDownloadType: 'yaml',
  hideDarkModeToggle: false,
  metaData: { title: 'Nestbox API reference' },
} as const;

/**
 * Mounted by a separate same-origin script rather than inline, so the page's CSP needs no
 * 'unsafe-inline' for scripts. The spec's relative server (`/api/v1`) is resolved against the
 * page's own origin, so "try it" calls this server whatever name the reader reached it by.
 */
const INIT_SCRIPT = `// Nestbox: mounts Scalar's API reference (src/http/api-docs.ts).
Scalar.createApiReference('#nestbox-api-reference', Object.assign(${JSON.stringify(SCALAR_CONFIGURATION)}, { baseServerURL: window.location.origin }));
`;

const PAGE = `<!doctype html>
<html lang="en">
  <head>
    <meta charset="utf-8">
    <meta name="viewport" content="width=device-width, initial-scale=1">
    <title>Nestbox API reference</title>
  </head>
  <body>
    <div id="nestbox-api-reference"></div>
    <script src="/docs/standalone.js"></script>
    <script src="/docs/init.js"></script>
  </body>
</html>
`;

/**
 * Only this origin for scripts, fetches, fonts and images. Scalar's Vue components inject their
 * styles as <style> elements and set `style` attributes at run time (a few dozen distinct ones,
 * so hashes are no option), so styles also need 'unsafe-inline' (inline styles cannot run code).
 * Scalar needs nothing else (no eval, no workers, no data: images). Nothing may frame the page.
 */
export const API_DOCS_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self' 'unsafe-inline'",
  "connect-src 'self'",
  "font-src 'self'",
  "img-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join('; ');

function sendPage(_req: Request, res: Response): void {
  res.set({ 'Content-Security-Policy': API_DOCS_CSP, 'Cache-Control': 'no-cache', 'X-Content-Type-Options': 'nosniff' });
  res.type('html').send(PAGE);
}

export function createApiDocsRouter(): Router {
  const router = express.Router({ strict: false });
  router.get('/', sendPage);
  router.get('/init.js', (_req, res) => {
    res.set({ 'Cache-Control': 'no-cache', 'X-Content-Type-Options': 'nosniff' });
    res.type('text/javascript').send(INIT_SCRIPT);
  });
  router.get('/standalone.js', (_req, res) => {
    const bundle = API_REFERENCE_BUNDLE();
    // From the sources without a build there is no bundle: say how to get one.
    if (!existsSync(bundle)) return renderNativeError(res, new NestboxError('not_found', 'the API reference bundle is not built (run `npm run build`)'));
    // A day, then revalidated by ETag / Last-Modified: a new Scalar arrives with the next build.
    res.set('X-Content-Type-Options', 'nosniff');
    res.sendFile(bundle, { maxAge: '1d', headers: { 'Content-Type': 'text/javascript; charset=utf-8' } });
  });
  return router;
}

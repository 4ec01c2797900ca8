// The routes an express router serves, read from its own routing table (not a hand-kept list),
// so a route added to a compat layer shows up in the scope tests without anyone listing it.
import type { Router } from 'express';

interface Layer {
  route?: { path: string | string[]; methods: Record<string, boolean> };
  handle?: { stack?: Layer[]; isScopeGate?: boolean };
  rawPath?: string | string[] | RegExp;
}

export interface ListedRoute {
  method: string;
  path: string;
}

export function listRoutes(router: Router, prefix = ''): ListedRoute[] {
  const out: ListedRoute[] = [];
  const walk = (stack: Layer[], base: string) => {
    for (const layer of stack) {
      if (layer.route) {
        const paths = ([] as string[]).concat(layer.route.path);
        const methods = Object.keys(layer.route.methods).map((m) => (m === '_all' ? 'ALL' : m.toUpperCase()));
        for (const path of paths) for (const method of methods) out.push({ method, path: base + path });
      } else if (layer.handle?.stack && !layer.handle.isScopeGate) {
        if (typeof layer.rawPath !== 'string') throw new Error(`route listing: a mounted router at ${String(layer.rawPath)} (only string mount paths are listed)`);
        walk(layer.handle.stack, base + (layer.rawPath === '/' ? '' : layer.rawPath));
      }
    }
  };
  walk((router as unknown as { stack: Layer[] }).stack, prefix);
  return out;
}

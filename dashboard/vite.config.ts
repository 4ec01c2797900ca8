// The dashboard's bundle: `npm run build` runs `vite build --config dashboard/vite.config.ts`
// after tsc, so dist/dashboard/ holds index.html and hashed assets that src/http/dashboard.ts
// serves. Everything (scripts, xterm's css) is bundled: nothing is fetched from a CDN at run time.
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';
import react from '@vitejs/plugin-react';

const here = (path: string) => fileURLToPath(new URL(path, import.meta.url));

export default defineConfig({
  root: here('.'),
  // Asset URLs are absolute, so a deep SPA route (/sandboxes/<id>) reloaded still finds them.
  base: '/',
  plugins: [react()],
  build: {
    outDir: here('../dist/dashboard'),
    emptyOutDir: true,
    // A dashboard is not worth shipping source maps of to every visitor.
    sourcemap: false,
    chunkSizeWarningLimit: 800,
    // The plugin-timing report is advice for plugin authors, noise in every `npm run build`.
    rolldownOptions: { checks: { pluginTimings: false } },
  },
});

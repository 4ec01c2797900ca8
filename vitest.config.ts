import { defineConfig } from 'vitest/config';

// One config for the whole suite. Integration tests share the machine's network namespaces,
// cgroups and a PostgreSQL server, so files run one at a time; unit tests are fast anyway.
export default defineConfig({
  test: {
    include: ['core/**/*.test.ts', 'http-kit/**/*.test.ts', 'host/**/*.test.ts', 'src/**/*.test.ts', 'test/**/*.test.ts', 'contract-tests/**/*.test.ts'],
    exclude: ['node_modules/**', 'dist/**'],
    pool: 'forks',
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 600_000,
    globalSetup: ['test/global-setup.ts'],
  },
});

// POST /files/metadata and /files/metadata/read: user extended attributes through the pty
// helper's --xattr mode, compiled from the current source.
import { mkdir, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startProcessTestAgent, type ProcessTestAgent } from './processes/test-support.js';

describe('file metadata routes', () => {
  let agent: ProcessTestAgent;

  beforeAll(async () => {
    agent = await startProcessTestAgent();
  });
  afterAll(async () => {
    await agent.stop();
  });

  it('sets, reads back and replaces a group of user attributes, leaving others alone', async () => {
    const file = join(agent.home, 'meta.txt');
    await writeFile(file, 'x');
    const set = await agent.call('POST', '/files/metadata', { path: 'meta.txt', set: { 'e2b.author': 'mish', 'e2b.purpose': 'upload', foreign: 'keep me' } });
    expect(set.status).toBe(200);
    expect(set.json).toEqual({ path: file, metadata: { 'e2b.author': 'mish', 'e2b.purpose': 'upload', foreign: 'keep me' } });

    // Replacing the e2b. group drops its stale key and keeps what is outside it.
    const replaced = await agent.call('POST', '/files/metadata', { path: file, set: { 'e2b.author': 'alice' }, replacePrefix: 'e2b.' });
    expect(replaced.json.metadata).toEqual({ 'e2b.author': 'alice', foreign: 'keep me' });

    await mkdir(join(agent.home, 'plain-dir'), { recursive: true });
    await symlink('meta.txt', join(agent.home, 'meta-link'));
    const read = await agent.call('POST', '/files/metadata/read', { paths: ['meta.txt', 'plain-dir', 'nope.txt', 'meta-link'] });
    expect(read.status).toBe(200);
    expect(read.json.entries).toEqual([
      { path: file, metadata: { 'e2b.author': 'alice', foreign: 'keep me' } },
      { path: join(agent.home, 'plain-dir'), metadata: {} },
      { path: join(agent.home, 'nope.txt'), metadata: {} },
      // Symlinks are followed.
      { path: join(agent.home, 'meta-link'), metadata: { 'e2b.author': 'alice', foreign: 'keep me' } },
    ]);

    // Byte-exact: spaces, '=' and non-ASCII text survive.
    const odd = await agent.call('POST', '/files/metadata', { path: file, set: { 'e2b.note': 'a = b c ünï' }, replacePrefix: 'e2b.' });
    expect(odd.json.metadata['e2b.note']).toBe('a = b c ünï');
  });

  it('answers 404 for a missing file and 400 naming metadata for bad names', async () => {
    const missing = await agent.call('POST', '/files/metadata', { path: 'missing.txt', set: { a: 'b' } });
    expect(missing.status).toBe(404);
    // Below a file (ENOTDIR) is missing too, with or without a group to replace.
    const belowFile = await agent.call('POST', '/files/metadata', { path: 'meta.txt/inner', set: {}, replacePrefix: 'e2b.' });
    expect(belowFile.status).toBe(404);
    const empty = await agent.call('POST', '/files/metadata', { path: 'meta.txt', set: { '': 'b' } });
    expect(empty.status).toBe(400);
    expect(empty.json.error.message).toMatch(/^metadata: /);
    const long = await agent.call('POST', '/files/metadata', { path: 'meta.txt', set: { ['k'.repeat(300)]: 'b' } });
    expect(long.status).toBe(400);
  });
});

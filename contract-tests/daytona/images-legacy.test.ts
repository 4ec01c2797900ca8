// Image builds through the older SDK generation (@daytonaio/sdk 0.129, installed as
// daytona-sdk-legacy), where it differs from 0.218: it streams build logs from the deprecated
// direct routes `GET /snapshots/{id}/build-logs?follow=true` and `GET /sandbox/{id}/build-logs?follow=true`
// (no build-logs-url), starts the snapshot log at once when the POST answers a state other than
// `pending`, and reaches the toolbox through GET /config's proxyToolboxUrl.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Daytona as LegacyDaytona, Image as LegacyImage, type Sandbox as LegacySandbox } from 'daytona-sdk-legacy';
import { startTestServer, type TestServer } from '../../test/harness.js';

describe('Daytona image builds with @daytonaio/sdk 0.129', () => {
  let server: TestServer;
  let daytona: LegacyDaytona;
  let work: string;
  const created: LegacySandbox[] = [];
  beforeAll(async () => {
    for (const k of Object.keys(process.env)) if (k.startsWith('DAYTONA_')) delete process.env[k];
    work = mkdtempSync('/tmp/nbx-daytona-legacy-img-');
    server = await startTestServer();
    daytona = new LegacyDaytona({ apiUrl: `${server.url}/daytona/api`, apiKey: server.apiKey, target: 'local' });
  });
  afterAll(async () => {
    for (const s of created) await s.delete().catch(() => undefined);
    await server?.close();
    rmSync(work, { recursive: true, force: true });
  });

  it('snapshot.create with onLogs, then create from it', async () => {
    const file = join(work, 'note.txt');
    writeFileSync(file, 'legacy context\n');
    const logs: string[] = [];
    const image = LegacyImage.base('default').addLocalFile(file, '/opt/note.txt').runCommands('echo legacy-built > /legacy.txt');
    const snapshot = await daytona.snapshot.create({ name: 'legacy-img', image }, { onLogs: (c) => logs.push(c) });
    expect(snapshot.state).toBe('active');
    expect(logs.join('\n')).toMatch(/RUN echo legacy-built > \/legacy.txt/);
    const sb = await daytona.create({ snapshot: 'legacy-img', networkBlockAll: true } as never);
    created.push(sb);
    expect((await sb.process.executeCommand('cat /legacy.txt /opt/note.txt')).result).toBe('legacy-built\nlegacy context\n');
  }, 600_000);

  it('create({image}) with onSnapshotCreateLogs builds on demand', async () => {
    const logs: string[] = [];
    const sb = await daytona.create({ image: LegacyImage.base('default').runCommands('echo legacy-od > /od.txt'), networkBlockAll: true } as never, { timeout: 0, onSnapshotCreateLogs: (c: string) => logs.push(c) } as never);
    created.push(sb);
    expect(sb.state).toBe('started');
    expect(logs.join('\n')).toMatch(/RUN echo legacy-od > \/od.txt/);
    expect((await sb.process.executeCommand('cat /od.txt')).result).toBe('legacy-od\n');
  }, 600_000);
});

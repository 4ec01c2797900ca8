// LSP through the real @daytonaio/sdk 0.218 and 0.129 (daytona-wave2.md §5): real language
// servers in the sandbox — Debian's pylsp for python, typescript-language-server (npm) for
// typescript — started by the guest agent; the SDK parses their answers as CompletionList and
// LspSymbol[].
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DaytonaBadRequestError, DaytonaError, DaytonaLspServerNotInitializedError, type Sandbox } from '@daytonaio/sdk';
import { Daytona as LegacyDaytona } from 'daytona-sdk-legacy';
import { startDaytonaEnv, type DaytonaTestEnv } from './helpers.js';

const PYTHON_PROJECT = '/tmp/nbx-lsp-py';
const PYTHON_SOURCE = `import os


def greet(name):
    return "hello " + name


class Greeter:
    def wave(self):
        return 1


text = "abc"
text.
`;

const TS_PROJECT = '/tmp/nbx-lsp-ts';
const TS_SOURCE = `export function greetUser(name: string): string {
  return 'hello ' + name;
}

export class Waver {
  waveHand(): number {
    return 1;
  }
}

const w = new Waver();
w.
`;

/** SymbolKind (LSP): the two kinds the files above declare. */
const FUNCTION = 12;
const CLASS = 5;

describe('Daytona LSP with @daytonaio/sdk', () => {
  let env: DaytonaTestEnv;
  let sb: Sandbox;
  beforeAll(async () => {
    env = await startDaytonaEnv();
    sb = await env.daytona.create({ networkBlockAll: true });
    await sb.fs.uploadFile(Buffer.from(PYTHON_SOURCE), `${PYTHON_PROJECT}/app.py`);
    await sb.fs.uploadFile(Buffer.from('def helper_elsewhere():\n    pass\n'), `${PYTHON_PROJECT}/pkg/other.py`);
    await sb.fs.uploadFile(Buffer.from(TS_SOURCE), `${TS_PROJECT}/index.ts`);
  }, 180_000);
  afterAll(async () => {
    await env?.server.close();
  });

  it('python (pylsp): start, didOpen, completions, documentSymbols, sandboxSymbols, didClose, stop', async () => {
    const lsp = await sb.createLspServer('python', PYTHON_PROJECT);
    await lsp.start();
    // A second start of the same server is a no-op, as on Daytona.
    await lsp.start();
    // It runs as the sandbox's user, like the commands of the toolbox.
    const runAs = await sb.process.executeCommand('ps -o user= -C pylsp');
    expect(runAs.result.trim()).toBe((await sb.process.executeCommand('whoami')).result.trim());
    const file = `${PYTHON_PROJECT}/app.py`;
    await lsp.didOpen(file);

    const completions = await lsp.completions(file, { line: 13, character: 5 });
    expect(typeof completions.isIncomplete).toBe('boolean');
    const upper = completions.items.find((item) => item.label === 'upper' || item.insertText === 'upper');
    expect(upper, JSON.stringify(completions.items.slice(0, 10))).toBeDefined();
    expect(typeof upper!.kind).toBe('number');

    const symbols = await lsp.documentSymbols(file);
    const greet = symbols.find((s) => s.name === 'greet');
    expect(greet, JSON.stringify(symbols)).toMatchObject({ kind: FUNCTION, location: { uri: `file://${file}`, range: { start: { line: 3 } } } });
    expect(symbols.find((s) => s.name === 'Greeter')?.kind).toBe(CLASS);

    // pylsp has no workspace/symbol: answered from its document symbols of the project's files.
    const found = await lsp.sandboxSymbols('greet');
    expect(found.map((s) => [s.name, s.location.uri])).toContainEqual(['greet', `file://${file}`]);
    const elsewhere = await lsp.workspaceSymbols('helper_else');
    expect(elsewhere.map((s) => [s.name, s.location.uri])).toEqual([['helper_elsewhere', `file://${PYTHON_PROJECT}/pkg/other.py`]]);

    await lsp.didClose(file);
    await lsp.stop();
    // Stopped: document calls are the daemon's "not initialized".
    await expect(lsp.documentSymbols(file)).rejects.toBeInstanceOf(DaytonaLspServerNotInitializedError);
  }, 180_000);

  it('typescript (typescript-language-server): completions of a method, symbols, sandboxSymbols, stop', async () => {
    const lsp = await sb.createLspServer('typescript', TS_PROJECT);
    await lsp.start();
    const file = `${TS_PROJECT}/index.ts`;
    await lsp.didOpen(file);

    const completions = await lsp.completions(file, { line: 11, character: 2 });
    const labels = completions.items.map((item) => item.label);
    expect(labels, JSON.stringify(labels.slice(0, 20))).toContain('waveHand');

    const symbols = await lsp.documentSymbols(file);
    expect(symbols.find((s) => s.name === 'greetUser'), JSON.stringify(symbols)).toMatchObject({ kind: FUNCTION, location: { uri: `file://${file}` } });
    expect(symbols.find((s) => s.name === 'Waver')?.kind).toBe(CLASS);

    const found = await lsp.sandboxSymbols('greetUser');
    expect(found.map((s) => [s.name, s.location.uri])).toContainEqual(['greetUser', `file://${file}`]);

    await lsp.stop();
    await expect(lsp.completions(file, { line: 0, character: 0 })).rejects.toBeInstanceOf(DaytonaLspServerNotInitializedError);
  }, 180_000);

  it('javascript: the same server on a .js file', async () => {
    await sb.fs.uploadFile(Buffer.from('function addNumbers(a, b) {\n  return a + b;\n}\n[].ma\n'), `${TS_PROJECT}/js/util.js`);
    const lsp = await sb.createLspServer('javascript', `${TS_PROJECT}/js`);
    await lsp.start();
    const file = `${TS_PROJECT}/js/util.js`;
    await lsp.didOpen(file);
    expect((await lsp.documentSymbols(file)).find((s) => s.name === 'addNumbers')?.kind).toBe(FUNCTION);
    expect((await lsp.completions(file, { line: 3, character: 5 })).items.map((i) => i.label)).toContain('map');
    await lsp.stop();
  }, 180_000);

  it('refuses what the daemon refuses: an unsupported language, calls before start, a server that died', async () => {
    // The SDK checks the language itself…
    await expect(sb.createLspServer('ruby' as never, PYTHON_PROJECT)).rejects.toThrow(/Invalid languageId: ruby/);
    // …and a client that skips that check gets the server's 400 naming it.
    const ruby = await sb.createLspServer('python', PYTHON_PROJECT);
    (ruby as unknown as { languageId: string }).languageId = 'ruby';
    const refused = await ruby.start().catch((err: unknown) => err);
    expect(refused).toBeInstanceOf(DaytonaBadRequestError);
    expect((refused as DaytonaError).message).toMatch(/unsupported language "ruby"/);

    const never = await sb.createLspServer('python', '/tmp/never-started');
    const early = await never.didOpen('/tmp/never-started/x.py').catch((err: unknown) => err);
    expect(early).toBeInstanceOf(DaytonaLspServerNotInitializedError);
    expect((early as DaytonaError).statusCode).toBe(400);

    // A server that dies is reported as such, with how it ended.
    const lsp = await sb.createLspServer('python', PYTHON_PROJECT);
    await lsp.start();
    await sb.process.executeCommand('pkill -KILL -x pylsp');
    const dead = await lsp.documentSymbols(`${PYTHON_PROJECT}/app.py`).catch((err: unknown) => err);
    expect(dead).toBeInstanceOf(DaytonaLspServerNotInitializedError);
    expect((dead as DaytonaError).message).toMatch(/python language server for \/tmp\/nbx-lsp-py has exited \(killed by SIGKILL\)/);
    // Started again, it answers.
    await lsp.start();
    expect((await lsp.documentSymbols(`${PYTHON_PROJECT}/app.py`)).map((s) => s.name)).toContain('greet');
    await lsp.stop();
  }, 180_000);

  it('speaks the same routes to @daytonaio/sdk 0.129', async () => {
    const legacy = new LegacyDaytona({ apiUrl: env.apiUrl, apiKey: env.server.apiKey, target: 'local' });
    const lsb = await legacy.get(sb.id);
    const lsp = await lsb.createLspServer('python', PYTHON_PROJECT);
    await lsp.start();
    await lsp.didOpen(`${PYTHON_PROJECT}/app.py`);
    expect((await lsp.completions(`${PYTHON_PROJECT}/app.py`, { line: 13, character: 5 })).items.map((i) => i.label)).toContain('upper');
    expect((await lsp.documentSymbols(`${PYTHON_PROJECT}/app.py`)).map((s) => s.name)).toContain('Greeter');
    expect((await lsp.sandboxSymbols('greet')).map((s) => s.name)).toContain('greet');
    await lsp.stop();
  }, 180_000);
});

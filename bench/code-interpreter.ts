// Code interpreter figures for `npm run bench` (issue 15), each beside a baseline measured in the
// same run and the same sandbox:
// - the first result of `1+1` in a new context (create + first run: a kernel starts), beside a
//   warm run;
// - a warm `1+1` in a context beside `python3 -c 'print(1+1)'` through the commands API (ratio);
// - a cell that displays a ~1 MiB PNG (IPython.display.Image), answered as one JSON, beside
//   downloading the same file through the files API.
// Counts are bounded by the caller (--code-runs); no thresholds.
import { call, ms, quantile, timed, type Call } from './measure.js';

export interface CodeBenchOptions {
  /** `…/api/v1` of the server. */
  base: string;
  key: string;
  /** Warm runs per measured figure (first-result runs are a fifth of it, at least 3). */
  runs: number;
  /** The image of the sandbox the cells run in. */
  image: string;
  /** Called with every sandbox this creates, so the caller's cleanup deletes it. */
  track: (sandboxId: string) => void;
}


function expectStatus(res: Call, status: number, what: string): void {
  if (res.status !== status) throw new Error(`${what} answered ${res.status}: ${res.body.slice(0, 500)}`);
}

/** Writes a 512×512 RGBA PNG of random pixels (incompressible: ~1 MiB) with the standard library only. */
const MAKE_PNG = `
import os, struct, zlib
w = h = 512
raw = b"".join(b"\\x00" + os.urandom(w * 4) for _ in range(h))
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
png = b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw, 0)) + chunk(b"IEND", b"")
open("/root/bench.png", "wb").write(png)
print(len(png))
`;

export async function benchCodeInterpreter(o: CodeBenchOptions): Promise<void> {
  const { base, key } = o;
  const created = await call(base, key, 'POST', '/sandboxes', { timeoutSeconds: 0, memoryMiB: 1024, image: o.image, egress: { mode: 'deny-all' } });
  expectStatus(created, 201, `create a sandbox from ${o.image}`);
  const id = JSON.parse(created.body).id as string;
  o.track(id);
  const runCell = async (body: Record<string, unknown>) => {
    const res = await call(base, key, 'POST', `/sandboxes/${id}/code/run`, body);
    expectStatus(res, 200, 'code run');
    const result = JSON.parse(res.body) as { status: string; text: string | null; results: { data: Record<string, unknown> }[]; error: unknown };
    if (result.status !== 'ok') throw new Error(`cell ${JSON.stringify(body.code).slice(0, 60)} ended ${result.status}: ${JSON.stringify(result.error)}`);
    return result;
  };

  // 1. First result in a new context: the kernel's start and its first cell.
  const firstRuns = Math.max(3, Math.floor(o.runs / 5));
  const creates: number[] = [];
  const firsts: number[] = [];
  for (let i = 0; i < firstRuns; i++) {
    const [total, contextId] = await timed(async () => {
      const [c, res] = await timed(() => call(base, key, 'POST', `/sandboxes/${id}/code/contexts`, { language: 'python' }));
      expectStatus(res, 201, 'create a context');
      creates.push(c);
      const ctx = JSON.parse(res.body).id as string;
      const result = await runCell({ code: '1+1', contextId: ctx });
      if (result.text !== '2') throw new Error(`1+1 gave ${result.text}`);
      return ctx;
    });
    firsts.push(total);
    expectStatus(await call(base, key, 'DELETE', `/sandboxes/${id}/code/contexts/${contextId}`), 204, 'delete a context');
  }

  // 2. Warm runs in one context, interleaved with the same arithmetic through python3 -c.
  const ctx = await call(base, key, 'POST', `/sandboxes/${id}/code/contexts`, { language: 'python' });
  expectStatus(ctx, 201, 'create a context');
  const contextId = JSON.parse(ctx.body).id as string;
  await runCell({ code: '1+1', contextId });
  const warm: number[] = [];
  const execs: number[] = [];
  for (let i = 0; i < o.runs; i++) {
    warm.push((await timed(() => runCell({ code: '1+1', contextId })))[0]);
    execs.push((await timed(async () => {
      const res = await call(base, key, 'POST', `/sandboxes/${id}/commands`, { argv: ['python3', '-c', 'print(1+1)'] });
      expectStatus(res, 200, 'exec python3 -c');
      if (JSON.parse(res.body).stdout !== '2\n') throw new Error(`python3 -c gave ${res.body}`);
    }))[0]);
  }
  const [first, warmP50, execP50] = [quantile(firsts, 0.5), quantile(warm, 0.5), quantile(execs, 0.5)];
  console.log(`code: first result of 1+1 in a new context (n=${firstRuns}): p50 ${ms(first)} (of which the context's create ${ms(quantile(creates, 0.5))}); warm run p50 ${ms(warmP50)} → ×${(first / warmP50).toFixed(1)}`);
  console.log(`code: warm run('1+1') (n=${o.runs}): p50 ${ms(warmP50)}, p95 ${ms(quantile(warm, 0.95))}; baseline exec python3 -c 'print(1+1)' p50 ${ms(execP50)} → ×${(warmP50 / execP50).toFixed(2)} of python3 -c`);

  // 3. A ~1 MiB PNG result end to end vs downloading the same file.
  const made = await call(base, key, 'POST', `/sandboxes/${id}/commands`, { argv: ['python3', '-c', MAKE_PNG] });
  expectStatus(made, 200, 'write the PNG');
  const pngBytes = Number(JSON.parse(made.body).stdout);
  const pngRuns = Math.max(3, Math.floor(o.runs / 3));
  const pngCells: number[] = [];
  const downloads: number[] = [];
  for (let i = 0; i < pngRuns; i++) {
    pngCells.push((await timed(async () => {
      const result = await runCell({ code: 'from IPython.display import Image, display\ndisplay(Image(filename="/root/bench.png"))', contextId });
      const png = result.results.find((r) => typeof r.data['image/png'] === 'string')?.data['image/png'] as string | undefined;
      if (!png || Buffer.from(png, 'base64').length !== pngBytes) throw new Error(`the PNG result has ${png ? Buffer.from(png, 'base64').length : 0} bytes, not ${pngBytes}`);
    }))[0]);
    downloads.push((await timed(async () => {
      const res = await fetch(`${base}/sandboxes/${id}/files?path=/root/bench.png`, { headers: { authorization: `Bearer ${key}` } });
      const bytes = (await res.arrayBuffer()).byteLength;
      if (res.status !== 200 || bytes !== pngBytes) throw new Error(`download answered ${res.status} with ${bytes} bytes`);
    }))[0]);
  }
  const [cell, download] = [quantile(pngCells, 0.5), quantile(downloads, 0.5)];
  console.log(`code: a ${(pngBytes / 1024 / 1024).toFixed(2)} MiB PNG result, cell → JSON answer (n=${pngRuns}): p50 ${ms(cell)}; baseline file download p50 ${ms(download)} → ×${(cell / download).toFixed(1)}`);
  await call(base, key, 'DELETE', `/sandboxes/${id}`);
}

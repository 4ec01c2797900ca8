// The `code-interpreter` built-in image: a real sandbox from `{image: "code-interpreter"}` (the
// image is built by the suite's global setup), with no way out (deny-all egress). Every kernel
// the image lists is started through jupyter_client and runs code, as root and as E2B's and
// Daytona's users; the data stack imports and renders; the native API lists it and refuses to
// delete or tag it.
import { describe, expect, it } from 'vitest';
import { imageSandbox } from './image-sandbox-testing.js';
import { CODE_INTERPRETER_KERNELS, DENO_PACKAGE } from './code-interpreter-image.js';

const box = imageSandbox({ image: 'code-interpreter', timeoutSeconds: 0, memoryMiB: 2048, egress: { mode: 'deny-all' } });
const run = box.run;

/** Writes `text` to `path` in the sandbox (through a command: the test needs no other API). */
async function write(path: string, text: string): Promise<void> {
  await run(`mkdir -p "$(dirname ${path})" && printf %s '${Buffer.from(text).toString('base64')}' | base64 -d > ${path} && chmod 644 ${path}`);
}

// Starts each kernel named on the command line with jupyter_client, runs its snippet, prints
// {kernel: stdout of the cell}. An execute_result or a stream message that arrives after the
// kernel says idle (Deno's first cell does that) still counts: iopub is read until both came.
const KERNEL_PROBE = `
import json, queue, sys, time
from jupyter_client.manager import start_new_kernel
code = {
    "python3": "import numpy; print(int(numpy.arange(7).sum() * 2))",
    "bash": "echo $((40 + 2))",
    "deno": "const n: number = 40; console.log(n + 2)",
    "ir": "cat(40 + 2, '\\\\n')",
}
out = {}
for name in sys.argv[1:]:
    km, kc = start_new_kernel(kernel_name=name, startup_timeout=180)
    try:
        msg_id = kc.execute(code[name])
        text, idle, deadline = "", False, time.time() + 180
        while time.time() < deadline and not (idle and text):
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                text += msg["content"]["text"]
            elif msg["msg_type"] == "error":
                text += "ERROR " + msg["content"]["ename"] + ": " + msg["content"]["evalue"]
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
        out[name] = text.strip()
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
print(json.dumps(out))
`;

const USERS = [undefined, 'user', 'daytona'] as const;

describe('the code-interpreter image', () => {
  it('lists the python3, deno, bash and ir kernels system-wide', async () => {
    const listed = JSON.parse(await run('jupyter kernelspec list --json 2>/dev/null', 'user')) as { kernelspecs: Record<string, { resource_dir: string; spec: { language: string; argv: string[] } }> };
    expect(Object.keys(listed.kernelspecs).sort()).toEqual([...CODE_INTERPRETER_KERNELS].sort());
    expect(listed.kernelspecs.python3!.spec.language).toBe('python');
    expect(listed.kernelspecs.deno!.spec).toMatchObject({ language: 'typescript', argv: ['/usr/local/bin/deno', 'jupyter', '--kernel', '--conn', '{connection_file}'] });
    expect(listed.kernelspecs.bash!.spec.language).toBe('bash');
    expect(listed.kernelspecs.ir!.spec.language).toBe('R');
    // System-wide, not in anyone's home: every account sees the same kernels.
    for (const spec of Object.values(listed.kernelspecs)) expect(spec.resource_dir).toMatch(/^\/usr\/(local\/)?share\/jupyter\/kernels\//);
  });

  it.each(USERS)('runs a cell in every kernel as %s', async (user) => {
    await write('/opt/nbx-test/kernel_probe.py', KERNEL_PROBE);
    const out = JSON.parse(await run(`cd ~ && python3 /opt/nbx-test/kernel_probe.py ${CODE_INTERPRETER_KERNELS.join(' ')} 2>/dev/null`, user)) as Record<string, string>;
    expect(out).toEqual({ python3: '42', bash: '42', deno: '42', ir: '42' });
  }, 600_000);

  it('has the Python data stack, and matplotlib renders a PNG with Agg', async () => {
    await run('python3 -c "import numpy, pandas, matplotlib, scipy, sklearn, seaborn, plotly, openpyxl, PIL, requests, ipykernel, jupyter_client"', 'user');
    const plot = [
      'import matplotlib',
      'matplotlib.use("Agg")',
      'import matplotlib.pyplot as plt, numpy as np',
      'x = np.linspace(0, 6.3, 50)',
      'plt.plot(x, np.sin(x)); plt.title("sine")',
      'plt.savefig("/tmp/nbx-plot.png")',
      'from PIL import Image',
      'im = Image.open("/tmp/nbx-plot.png"); print(im.format, im.size[0] > 100, im.size[1] > 100)',
    ].join('\n');
    await write('/opt/nbx-test/plot.py', plot);
    // No font warnings either: matplotlib's default font is in the image.
    const res = await box.t.http.post(`/api/v1/sandboxes/${box.id}/commands`).set(box.t.auth).send({ cmd: 'cd ~ && python3 /opt/nbx-test/plot.py', user: 'user', timeoutMs: 300_000 });
    expect(res.body, JSON.stringify(res.body)).toMatchObject({ exitCode: 0, stdout: 'PNG True True\n' });
    expect(res.body.stderr).not.toMatch(/findfont|Font family/);
    expect(await run('head -c 8 /tmp/nbx-plot.png | od -An -tx1 | tr -d " \\n"', 'user')).toBe('89504e470d0a1a0a');
  }, 300_000);

  it.each(USERS)('has deno and R on PATH for %s', async (user) => {
    expect(await run('deno --version', user)).toMatch(new RegExp(`^deno ${DENO_PACKAGE.version.replace(/\./g, '\\.')} `));
    expect(await run('R --version', user)).toMatch(/^R version 4\./);
    expect(await run("R --quiet --no-save -e 'library(IRkernel); cat(\"irkernel-ok\\n\")'", user)).toContain('irkernel-ok');
  }, 300_000);

  it('still is the default image underneath (node, the vendors’ users, sudo)', async () => {
    expect(await run('node --version', 'user')).toMatch(/^v\d+\./);
    expect(await run('id -un; sudo -n true && echo sudo-ok', 'user')).toBe('user\nsudo-ok\n');
  });
});

describe('the built-in images in the native API', () => {
  it('lists both built-in images, finds code-interpreter by name and name:latest, and refuses to delete or tag it', async () => {
    const listed = (await box.t.http.get('/api/v1/images').set(box.t.auth)).body.items as { id: string; name: string; tags: string[] }[];
    expect(listed.slice(0, 2).map((i) => [i.id, i.name, i.tags])).toEqual([
      ['default', 'default', ['latest']],
      ['code-interpreter', 'code-interpreter', ['latest']],
    ]);
    expect(((await box.t.http.get('/api/v1/images').query({ name: 'code-interpreter' }).set(box.t.auth)).body.items as { id: string }[]).map((i) => i.id)).toEqual(['code-interpreter']);
    for (const reference of ['code-interpreter', 'code-interpreter:latest']) {
      const got = await box.t.http.get(`/api/v1/images/${reference}`).set(box.t.auth);
      expect(got.status, reference).toBe(200);
      expect(got.body).toMatchObject({ id: 'code-interpreter', name: 'code-interpreter', base: 'code-interpreter' });
    }
    for (const reference of ['code-interpreter', 'code-interpreter:latest', 'default']) {
      const deleted = await box.t.http.delete(`/api/v1/images/${reference}`).set(box.t.auth);
      expect(deleted.status, reference).toBe(409);
      expect(JSON.stringify(deleted.body)).toContain('cannot be deleted');
    }
    expect((await box.t.http.get('/api/v1/images/code-interpreter').set(box.t.auth)).status).toBe(200);
    const tagged = await box.t.http.post('/api/v1/images/code-interpreter/tags').set(box.t.auth).send({ name: 'mine', tags: ['v1'] });
    expect(tagged.status).toBe(400);
    expect(JSON.stringify(tagged.body)).toContain('built-in image cannot be tagged');
    // A build may not take a built-in image's name.
    const named = await box.t.http.post('/api/v1/builds').set(box.t.auth).send({ name: 'code-interpreter', steps: [{ run: 'true' }] });
    expect(named.status).toBe(400);
    expect(JSON.stringify(named.body)).toContain('name');
  });

  it('is a build’s FROM: the built image keeps the kernels and adds its layer', async () => {
    const started = await box.t.http.post('/api/v1/builds').set(box.t.auth).send({ name: 'it-from-ci', dockerfile: 'FROM code-interpreter\nRUN python3 -c "import numpy; print(numpy.__version__)" > /numpy-version\n', egress: { mode: 'deny-all' } });
    expect(started.status, JSON.stringify(started.body)).toBe(202);
    const principal = await box.t.server.services.auth.authenticate(box.t.apiKey);
    const finished = await box.t.server.services.builds.waitFor(principal, started.body.id);
    expect(finished.state, JSON.stringify(finished)).toBe('succeeded');
    const image = (await box.t.http.get('/api/v1/images/it-from-ci').set(box.t.auth)).body;
    expect(image.base).toBe('code-interpreter');
    const sandbox = await box.t.http.post('/api/v1/sandboxes').set(box.t.auth).send({ image: 'it-from-ci', timeoutSeconds: 0, egress: { mode: 'deny-all' } });
    expect(sandbox.status, JSON.stringify(sandbox.body)).toBe(201);
    try {
      const res = await box.t.http.post(`/api/v1/sandboxes/${sandbox.body.id}/commands`).set(box.t.auth).send({ cmd: 'cat /numpy-version && jupyter kernelspec list 2>/dev/null | grep -c -E "^ +(python3|deno|bash|ir) "' });
      expect(res.body, JSON.stringify(res.body)).toMatchObject({ exitCode: 0, stdout: expect.stringMatching(/^1\.\d+\.\d+\n4\n$/) });
    } finally {
      await box.t.http.delete(`/api/v1/sandboxes/${sandbox.body.id}`).set(box.t.auth);
    }
  }, 600_000);

  it('reports the sandbox as started from code-interpreter', async () => {
    const got = await box.t.http.get(`/api/v1/sandboxes/${box.id}`).set(box.t.auth);
    expect(got.status).toBe(200);
    expect(got.body.image).toBe('code-interpreter');
  });
});

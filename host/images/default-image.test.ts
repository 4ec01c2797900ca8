// What coding agents rely on in the `default` image (E2B's and Daytona's images have it all):
// python3 with pip and venv, Node.js LTS with npm and npx, git, curl, a C toolchain, for root and
// for the vendors' users. A real sandbox from the real image (built by the suite's global setup),
// with no way out (deny-all egress): every install below is from files made in the sandbox.
import { describe, expect, it } from 'vitest';
import { imageSandbox } from './image-sandbox-testing.js';
import { NODE_VERSION, NPM_VERSION } from './node-runtime.js';

const box = imageSandbox({ timeoutSeconds: 0, memoryMiB: 1024, egress: { mode: 'deny-all' } });
const run = box.run;

const USERS = [undefined, 'user', 'daytona'] as const;

describe('the default image', () => {
  it.each(USERS)('has the tools on PATH for %s', async (user) => {
    expect(await run('node --version', user)).toBe(`v${NODE_VERSION}\n`);
    expect(await run('npm --version', user)).toBe(`${NPM_VERSION}\n`);
    expect(await run('npx --version', user)).toBe(`${NPM_VERSION}\n`);
    // The image's node, not the guest agent's (another binary, off PATH, left as it is).
    expect(await run('command -v node', user)).toBe('/usr/local/bin/node\n');
    expect(await run('/.nestbox/bin/node --version', user)).toBe(`${process.version}\n`);
    expect(await run('python3 --version; python --version', user)).toMatch(/^Python 3\.11\.\d+\nPython 3\.11\.\d+\n$/);
    expect(await run('pip --version; pip3 --version; python3 -m pip --version', user)).toMatch(/^(pip \d+.*python 3\.11\)\n){3}$/);
    expect(await run('git --version', user)).toMatch(/^git version 2\./);
    expect(await run('curl --version', user)).toMatch(/^curl \d/);
    expect(await run('gcc --version', user)).toMatch(/^gcc \(Debian/);
    expect(await run('g++ --version', user)).toMatch(/^g\+\+ \(Debian/);
    expect(await run('make --version', user)).toMatch(/^GNU Make \d/);
    expect(await run('sudo -n true && echo sudo-ok', user)).toBe('sudo-ok\n');
    // The code interpreter's Python kernel: IPython's kernel, jupyter_client, and its kernelspec.
    expect(await run('python3 -c "import ipykernel, jupyter_client, IPython; print(\'ok\')"', user)).toBe('ok\n');
    expect(await run('test -f /usr/share/jupyter/kernels/python3/kernel.json && echo spec-ok', user)).toBe('spec-ok\n');
  });

  it('compiles and runs C', async () => {
    await run('mkdir -p ~/c && cd ~/c && printf "#include <stdio.h>\\nint main(void){puts(\\"built\\");return 0;}\\n" > m.c && printf "m: m.c\\n\\tcc -o m m.c\\n" > Makefile && make -s', 'user');
    expect(await run('~/c/m', 'user')).toBe('built\n');
  });

  it('lets pip install a package outside a venv (root: /usr/local, users: ~/.local) and inside one', async () => {
    // A package with a console script, built into a wheel from its source with Debian's setuptools
    // (no build isolation: that would fetch setuptools from PyPI).
    const project = (dir: string, name: string) =>
      `rm -rf ${dir} && mkdir -p ${dir}/${name} && cd ${dir} && printf 'def main():\\n    print("hello from ${name}")\\n' > ${name}/__init__.py && ` +
      `printf '[build-system]\\nrequires = ["setuptools"]\\nbuild-backend = "setuptools.build_meta"\\n[project]\\nname = "${name}"\\nversion = "1.0"\\n[project.scripts]\\n${name} = "${name}:main"\\n' > pyproject.toml && ` +
      `pip wheel --no-index --no-build-isolation --no-deps -q -w dist . && ls dist`;

    expect(await run(project('/tmp/rootpkg', 'nbxroot'))).toBe('nbxroot-1.0-py3-none-any.whl\n');
    await run('pip install --no-index -q /tmp/rootpkg/dist/nbxroot-1.0-py3-none-any.whl');
    expect(await run('python3 -c "import nbxroot, os; print(os.path.dirname(nbxroot.__file__))"')).toBe('/usr/local/lib/python3.11/dist-packages/nbxroot\n');
    // Installed by root for everyone, command on PATH.
    expect(await run('nbxroot', 'user')).toBe('hello from nbxroot\n');

    expect(await run(project('~/userpkg', 'nbxuser'), 'user')).toBe('nbxuser-1.0-py3-none-any.whl\n');
    await run('pip install --no-index -q ~/userpkg/dist/nbxuser-1.0-py3-none-any.whl', 'user');
    expect(await run('python3 -c "import nbxuser; print(nbxuser.__file__)"', 'user')).toBe('/home/user/.local/lib/python3.11/site-packages/nbxuser/__init__.py\n');
    // A login shell (what `cmd` runs in) has ~/.local/bin on PATH once it exists (Debian's .profile).
    expect(await run('nbxuser', 'user')).toBe('hello from nbxuser\n');

    await run('python3 -m venv ~/venv && ~/venv/bin/pip install --no-index -q /home/user/userpkg/dist/nbxuser-1.0-py3-none-any.whl', 'daytona');
    expect(await run('~/venv/bin/python -c "import sys, nbxuser; print(sys.prefix, nbxuser.__name__)"', 'daytona')).toBe('/home/daytona/venv nbxuser\n');
    // The venv's site-packages, not the system's: the package is not visible outside it.
    await run('! python3 -c "import nbxuser" 2>/dev/null', 'daytona');
  });

  it('lets npm install and npx run a package (local and global)', async () => {
    const make = [
      'rm -rf ~/jspkg ~/app && mkdir -p ~/jspkg/bin ~/app && cd ~/jspkg',
      `printf '{"name":"nbx-hello","version":"1.0.0","bin":{"nbx-hello":"bin/hello.js"}}\\n' > package.json`,
      `printf '#!/usr/bin/env node\\nconsole.log("hello from " + process.version)\\n' > bin/hello.js`,
      'npm pack --silent',
    ].join(' && ');
    expect(await run(make, 'user')).toBe('nbx-hello-1.0.0.tgz\n');
    await run('cd ~/app && npm init -y >/dev/null && npm install --offline --no-audit --silent ~/jspkg/nbx-hello-1.0.0.tgz', 'user');
    expect(await run('cd ~/app && npx --offline nbx-hello', 'user')).toBe(`hello from v${NODE_VERSION}\n`);
    // Global installs (root) land in /usr/local, on everyone's PATH.
    await run('npm install -g --offline --no-audit --silent /home/user/jspkg/nbx-hello-1.0.0.tgz');
    expect(await run('command -v nbx-hello && nbx-hello', 'daytona')).toBe(`/usr/local/bin/nbx-hello\nhello from v${NODE_VERSION}\n`);
  });

  it('builds a native Node module with node-gyp from the image’s own headers (no download)', async () => {
    // binding.gyp makes npm run `node-gyp rebuild`; with egress closed it only works because
    // the image's npmrc points node-gyp at /usr/local/include/node.
    const addon = [
      'rm -rf ~/addon && mkdir -p ~/addon && cd ~/addon',
      `printf '{"name":"nbx-addon","version":"1.0.0","main":"build/Release/nbx.node"}\\n' > package.json`,
      `printf '{"targets":[{"target_name":"nbx","sources":["nbx.c"]}]}\\n' > binding.gyp`,
      `printf '#include <node_api.h>\\nstatic napi_value Answer(napi_env env, napi_callback_info info) { napi_value v; napi_create_int32(env, 42, &v); return v; }\\n` +
        `NAPI_MODULE_INIT() { napi_value f; napi_create_function(env, "answer", NAPI_AUTO_LENGTH, Answer, NULL, &f); napi_set_named_property(env, exports, "answer", f); return exports; }\\n' > nbx.c`,
      'npm install --offline --no-audit --silent >/dev/null',
      `node -p 'require("./").answer()'`,
    ].join(' && ');
    expect(await run(addon, 'user')).toBe('42\n');
  });
});

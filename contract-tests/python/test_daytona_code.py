"""The real `daytona` Python SDK (sync `Daytona`, and `AsyncDaytona` for the interpreter) against
Nestbox's code interpreter: `process.code_run` with matplotlib charts in `artifacts.charts`, argv, env, exit
codes and timeouts, typescript; `code_interpreter.run_code` with its callbacks, contexts, state, a
timeout the context survives, and the server's refusal of empty code. Charts and kernels need a
sandbox of the built-in `code-interpreter` image (`ci_sb`); plain code_run runs in the default
one. The Python client validates charts strictly (pydantic), so a chart that parses here has
Daytona's types."""

import pytest
import pytest_asyncio
from daytona import (
    AsyncDaytona,
    BarChart,
    ChartType,
    CodeRunParams,
    CreateSandboxFromSnapshotParams,
    Daytona,
    DaytonaConnectionError,
    DaytonaTimeoutError,
    LineChart,
)
from daytona_toolbox_api_client import DaemonErrorCode
from daytona_toolbox_api_client.exceptions import ApiException, BadRequestException

PNG_BASE64_PREFIX = "iVBORw0KGgo"


@pytest.fixture(scope="module")
def daytona():
    return Daytona()


@pytest.fixture(scope="module")
def sb(daytona):
    sandbox = daytona.create(CreateSandboxFromSnapshotParams(language="python", network_block_all=True), timeout=0)
    yield sandbox
    daytona.delete(sandbox)


# Kernels (code_interpreter) and matplotlib (charts) need the built-in `code-interpreter` image.
@pytest.fixture(scope="module")
def ci_sb(daytona):
    sandbox = daytona.create(CreateSandboxFromSnapshotParams(snapshot="code-interpreter", language="python", network_block_all=True), timeout=0)
    yield sandbox
    daytona.delete(sandbox)


# --- process.code_run ---


def test_code_run_line_and_bar_charts(ci_sb):
    r = ci_sb.process.code_run(
        "\n".join(
            [
                "import matplotlib.pyplot as plt",
                "plt.figure()",
                'plt.plot([1, 2, 3], [1, 4, 9], label="squares")',
                'plt.title("Growth")',
                'plt.xlabel("x")',
                'plt.ylabel("y")',
                "plt.show()",
                "plt.figure()",
                'plt.bar(["a", "b"], [3, 5])',
                'plt.title("Bars")',
                "plt.show()",
                'print("done")',
            ]
        )
    )
    assert r.exit_code == 0
    assert r.result == "done\n"
    line, bar = r.artifacts.charts
    assert isinstance(line, LineChart)
    assert line.type == ChartType.LINE
    assert line.title == "Growth"
    assert line.x_label == "x" and line.y_label == "y"
    assert line.png.startswith(PNG_BASE64_PREFIX)
    assert [(e.label, e.points) for e in line.elements] == [("squares", [[1, 1], [2, 4], [3, 9]])]
    assert isinstance(bar, BarChart)
    assert bar.title == "Bars"
    assert bar.png.startswith(PNG_BASE64_PREFIX)
    assert [(e.label, e.value) for e in bar.elements] == [("a", "3"), ("b", "5")]


def test_code_run_argv_env_exit_code_and_timeout(sb):
    r = sb.process.code_run(
        'import os, sys\nprint(sys.argv[1:], os.environ["CODE_VAR"])',
        params=CodeRunParams(argv=["a", "b"], env={"CODE_VAR": "set"}),
    )
    assert r.exit_code == 0
    assert r.result == "['a', 'b'] set\n"
    assert r.artifacts.charts == []
    assert sb.process.code_run("raise SystemExit(3)").exit_code == 3
    # `code_run` (0.226.1) wraps no error of its own: the daemon's 408 and 400 reach the caller
    # as the generated toolbox client's exceptions, with the status and Daytona's error body.
    with pytest.raises(ApiException) as timed_out:
        sb.process.code_run("import time; time.sleep(60)", timeout=1)
    assert timed_out.value.status == 408
    assert timed_out.value.data.code == DaemonErrorCode.CodeProcessExecutionTimeout
    with pytest.raises(BadRequestException) as bad_env:
        sb.process.code_run("print(1)", params=CodeRunParams(env={"BAD-KEY": "x"}))
    assert '"BAD-KEY" is not a valid environment variable name' in bad_env.value.data.message


def test_code_run_typescript(daytona):
    ts = daytona.create(CreateSandboxFromSnapshotParams(language="typescript", network_block_all=True), timeout=0)
    try:
        r = ts.process.code_run('const n: number = 6 * 7;\nconsole.log(n, process.argv.slice(2).join(","));', params=CodeRunParams(argv=["x"]))
        assert r.exit_code == 0
        assert r.result == "42 x\n"
    finally:
        daytona.delete(ts)


# --- code_interpreter ---


def test_run_code_streams_to_callbacks_and_reports_errors(ci_sb):
    out, err, errors = [], [], []
    r = ci_sb.code_interpreter.run_code(
        'import sys\nprint("out")\nprint("err", file=sys.stderr)\nraise ValueError("bad")',
        on_stdout=lambda m: out.append(m.output),
        on_stderr=lambda m: err.append(m.output),
        on_error=errors.append,
    )
    assert "".join(out) == "out\n" and r.stdout == "out\n"
    assert "".join(err) == "err\n" and r.stderr == "err\n"
    assert r.error is not None
    assert (r.error.name, r.error.value) == ("ValueError", "bad")
    assert "ValueError" in r.error.traceback and "\x1b[" not in r.error.traceback
    assert errors == [r.error]


def test_contexts_keep_state_apart_and_survive_a_timeout(ci_sb):
    a = ci_sb.code_interpreter.create_context(cwd="/tmp")
    b = ci_sb.code_interpreter.create_context()
    try:
        assert a.cwd == "/tmp" and a.language == "python" and a.active
        assert {c.id for c in ci_sb.code_interpreter.list_contexts()} == {a.id, b.id}
        ci_sb.code_interpreter.run_code('x = "in a"', context=a)
        assert ci_sb.code_interpreter.run_code("print(x)", context=a).stdout == "in a\n"
        assert ci_sb.code_interpreter.run_code('print("x" in globals())', context=b).stdout == "False\n"
        with pytest.raises(DaytonaTimeoutError):
            ci_sb.code_interpreter.run_code("import time\nwhile True:\n    time.sleep(0.1)", context=a, timeout=1)
        assert ci_sb.code_interpreter.run_code("print(x)", context=a).stdout == "in a\n"
        env = ci_sb.code_interpreter.run_code('import os\nprint(os.environ["RUN_VAR"])', context=b, envs={"RUN_VAR": "v"})
        assert env.stdout == "v\n"
    finally:
        ci_sb.code_interpreter.delete_context(a)
        ci_sb.code_interpreter.delete_context(b)
    assert ci_sb.code_interpreter.list_contexts() == []


def test_run_code_refuses_empty_code(ci_sb):
    with pytest.raises(DaytonaConnectionError, match=r"code is required \(close code 1008\)"):
        ci_sb.code_interpreter.run_code("")


# --- the async client ---


@pytest_asyncio.fixture(scope="module")
async def async_daytona():
    async with AsyncDaytona() as client:
        yield client


@pytest.mark.asyncio
async def test_async_run_code_and_code_run(async_daytona, ci_sb):
    asb = await async_daytona.get(ci_sb.id)
    seen = []
    r = await asb.code_interpreter.run_code("n = 6 * 7\nprint(n)", on_stdout=lambda m: seen.append(m.output))
    assert r.stdout == "42\n" and "".join(seen) == "42\n"
    assert (await asb.code_interpreter.run_code("print(n + 1)")).stdout == "43\n"
    with pytest.raises(DaytonaTimeoutError):
        await asb.code_interpreter.run_code("import time\ntime.sleep(60)", timeout=1)
    ran = await asb.process.code_run('print("async")')
    assert (ran.exit_code, ran.result) == (0, "async\n")

"""The real `e2b-code-interpreter` Python SDK (sync `Sandbox` and `AsyncSandbox`) against Nestbox's
code-interpreter kernel: results, stdout/stderr, errors, rich display data and code contexts."""

import base64

import pytest
import pytest_asyncio
from e2b import NotFoundException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox

# The smallest valid PNG (1x1, transparent): what a `_repr_png_` display hands the kernel.
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")


@pytest.fixture(scope="module")
def sbx():
    sandbox = Sandbox.create(allow_internet_access=False, timeout=600)
    yield sandbox
    sandbox.kill()


@pytest_asyncio.fixture(scope="module")
async def async_sbx():
    sandbox = await AsyncSandbox.create(allow_internet_access=False, timeout=600)
    yield sandbox
    await sandbox.kill()


def test_state_carries_over_and_the_last_expression_is_the_main_result(sbx):
    first = sbx.run_code('x = 41\nprint("set x")\nx + 1')
    assert first.error is None
    assert "".join(first.logs.stdout) == "set x\n"
    assert first.text == "42"
    assert first.results[0].is_main_result is True
    assert first.execution_count > 0
    assert sbx.run_code("x * 2").text == "82"


def test_stdout_and_stderr_reach_callbacks_and_logs(sbx):
    out, err = [], []
    execution = sbx.run_code(
        'import sys\nprint("to out")\nprint("to err", file=sys.stderr)',
        on_stdout=lambda m: out.append(m.line),
        on_stderr=lambda m: err.append(m.line),
    )
    assert "".join(out) == "to out\n"
    assert "".join(err) == "to err\n"
    assert "".join(execution.logs.stdout) == "to out\n"
    assert "".join(execution.logs.stderr) == "to err\n"


def test_an_exception_is_reported_as_an_execution_error(sbx):
    seen = []
    execution = sbx.run_code("def boom():\n    return 1 / 0\nboom()", on_error=seen.append)
    assert execution.error is not None
    assert execution.error.name == "ZeroDivisionError"
    assert execution.error.value == "division by zero"
    assert "boom" in execution.error.traceback
    assert execution.results == []
    assert [e.name for e in seen] == ["ZeroDivisionError"]


def test_rich_display_results_html_and_png(sbx):
    html = sbx.run_code('class Rich:\n    def _repr_html_(self): return "<b>rich</b>"\n    def __repr__(self): return "Rich()"\nRich()')
    assert html.results[0].html == "<b>rich</b>"
    assert html.text == "Rich()"
    assert "html" in html.results[0].formats()

    results = []
    png = sbx.run_code(
        "import base64\n"
        f"class Picture:\n    def _repr_png_(self): return base64.b64decode({base64.b64encode(PNG).decode()!r})\n"
        "Picture()",
        on_result=results.append,
    )
    assert base64.b64decode(png.results[0].png) == PNG
    assert "png" in png.results[0].formats()
    assert [base64.b64decode(r.png) for r in results] == [PNG]


def test_envs_apply_to_one_call(sbx):
    assert sbx.run_code('import os\nos.environ.get("ONLY_NOW")', envs={"ONLY_NOW": "yes"}).text == "yes"
    assert sbx.run_code('import os\nrepr(os.environ.get("ONLY_NOW"))').text == "None"


def test_a_runaway_cell_times_out_and_the_context_survives(sbx):
    sbx.run_code('survivor = "still here"')
    with pytest.raises(TimeoutException):
        sbx.run_code("while True:\n    pass", timeout=2)
    assert sbx.run_code("survivor").text == "still here"


def test_contexts_have_separate_state_and_can_be_restarted_and_removed(sbx):
    ctx = sbx.create_code_context(cwd="/tmp", language="python")
    assert ctx.id and ctx.language == "python" and ctx.cwd == "/tmp"
    sbx.run_code("inside = 7", context=ctx)
    assert sbx.run_code("inside", context=ctx).text == "7"
    assert sbx.run_code("import os\nos.getcwd()", context=ctx).text == "/tmp"
    assert sbx.run_code("inside").error.name == "NameError"
    assert ctx.id in [c.id for c in sbx.list_code_contexts()]

    sbx.restart_code_context(ctx)
    assert sbx.run_code("inside", context=ctx).error.name == "NameError"

    sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in sbx.list_code_contexts()]
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=ctx)


@pytest.mark.asyncio
async def test_async_run_code_results_logs_and_errors(async_sbx):
    out = []
    execution = await async_sbx.run_code('print("async out")\n6 * 7', on_stdout=lambda m: out.append(m.line))
    assert execution.text == "42"
    assert "".join(out) == "async out\n"
    failed = await async_sbx.run_code('raise ValueError("nope")')
    assert (failed.error.name, failed.error.value) == ("ValueError", "nope")


@pytest.mark.asyncio
async def test_async_contexts(async_sbx):
    ctx = await async_sbx.create_code_context(cwd="/tmp")
    await async_sbx.run_code("y = 'ctx'", context=ctx)
    # A str result's text is the string itself, as E2B's own tests expect (os.getenv(...) == "bar").
    assert (await async_sbx.run_code("y", context=ctx)).text == "ctx"
    assert (await async_sbx.run_code("y")).error.name == "NameError"
    await async_sbx.remove_code_context(ctx.id)
    assert ctx.id not in [c.id for c in await async_sbx.list_code_contexts()]

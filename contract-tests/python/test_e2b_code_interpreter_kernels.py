"""The real `e2b-code-interpreter` Python SDK on the `code-interpreter` template (its default,
code-interpreter-v1): Jupyter kernels through compat/e2b's translation of core's code interpreter.
Charts (PNG and chart data), display(), DataFrames, tracebacks, streaming, timeouts, languages
and contexts, as the SDK's own objects show them."""

import base64
import time

import pytest
import pytest_asyncio
from e2b import NotFoundException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox
from e2b_code_interpreter.charts import BarChart, ChartType, LineChart, PieChart

PNG_MAGIC = b"\x89PNG"


@pytest.fixture(scope="module")
def sbx():
    sandbox = Sandbox.create(allow_internet_access=False, timeout=900)
    yield sandbox
    sandbox.kill()


@pytest_asyncio.fixture(scope="module")
async def async_sbx():
    sandbox = await AsyncSandbox.create(allow_internet_access=False, timeout=900)
    yield sandbox
    await sandbox.kill()


def test_a_line_chart_comes_back_as_png_and_chart_data(sbx):
    execution = sbx.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.figure()\n"
        "plt.plot([0, 1, 2, 3], [0, 1, 4, 9], label='squares')\n"
        "plt.title('Growth')\n"
        "plt.xlabel('time (s)')\n"
        "plt.ylabel('value')\n"
        "plt.show()\n"
    )
    assert execution.error is None
    [figure] = execution.results
    assert figure.is_main_result is False
    assert base64.b64decode(figure.png)[:4] == PNG_MAGIC
    assert "png" in figure.formats() and "chart" in figure.formats()
    chart = figure.chart
    assert isinstance(chart, LineChart)
    assert chart.type == ChartType.LINE
    assert (chart.title, chart.x_label, chart.y_label, chart.x_unit, chart.y_unit) == ("Growth", "time (s)", "value", "s", None)
    assert [e.label for e in chart.elements] == ["squares"]
    assert chart.elements[0].points == [(0, 0), (1, 1), (2, 4), (3, 9)]


def test_bar_and_pie_charts(sbx):
    bar = sbx.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.figure()\n"
        "plt.bar(['a', 'b'], [1, 2], label='g')\n"
        "plt.title('Bars')\n"
        "plt.show()\n"
    ).results[0].chart
    assert isinstance(bar, BarChart)
    assert bar.title == "Bars"
    assert [(e.label, e.group, e.value) for e in bar.elements] == [("a", "g", 1), ("b", "g", 2)]

    pie = sbx.run_code(
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots()\n"
        "ax.pie([1, 3], labels=['small', 'big'])\n"
        "plt.title('Slices')\n"
        "plt.show()\n"
    ).results[0].chart
    assert isinstance(pie, PieChart)
    assert pie.title == "Slices"
    assert [e.label for e in pie.elements] == ["small", "big"]
    assert [round(e.angle) for e in pie.elements] == [90, 270]


def test_several_display_calls_and_the_main_result(sbx):
    seen = []
    execution = sbx.run_code(
        "from IPython.display import display, HTML, Markdown, Latex\n"
        "display(HTML('<i>one</i>'))\n"
        "display(Markdown('**two**'))\n"
        "display(Latex(r'$x^2$'))\n"
        "'main'",
        on_result=seen.append,
    )
    assert execution.error is None
    assert [r.is_main_result for r in execution.results] == [False, False, False, True]
    assert execution.results[0].html == "<i>one</i>"
    assert execution.results[1].markdown == "**two**"
    assert execution.results[2].latex == "$x^2$"
    assert execution.text == "main"
    assert len(seen) == 4


def test_a_dataframe_as_html_and_data(sbx):
    execution = sbx.run_code("import pandas as pd\npd.DataFrame({'n': [1, 2], 's': ['x', 'y']})")
    result = execution.results[0]
    assert "<table" in result.html
    assert result.data == {"n": [1, 2], "s": ["x", "y"]}
    assert "data" in result.formats()


def test_an_exception_with_its_traceback(sbx):
    execution = sbx.run_code("def inner():\n    raise ValueError('deep')\ninner()")
    assert (execution.error.name, execution.error.value) == ("ValueError", "deep")
    assert "inner" in execution.error.traceback
    assert execution.results == []


def test_stdout_arrives_before_the_cell_ends(sbx):
    # The cell waits for a file the test writes only once it has seen the cell's first line.
    flag = f"/tmp/py-go-{time.time_ns()}"
    lines = []

    def on_stdout(message):
        lines.append(message.line)
        if "waiting" in message.line:
            sbx.files.write(flag, "go")

    execution = sbx.run_code(
        "import os, time\n"
        "print('waiting', flush=True)\n"
        f"for _ in range(1200):\n    if os.path.exists({flag!r}):\n        break\n    time.sleep(0.05)\n"
        f"print('found' if os.path.exists({flag!r}) else 'gave up')",
        on_stdout=on_stdout,
        timeout=120,
    )
    assert lines == ["waiting\n", "found\n"]
    assert execution.logs.stdout == ["waiting\n", "found\n"]


def test_a_runaway_cell_is_interrupted_and_its_context_survives(sbx):
    sbx.run_code("kept = 'alive'")
    with pytest.raises(TimeoutException):
        sbx.run_code("while True:\n    pass", timeout=3)
    after = sbx.run_code("kept", timeout=60)
    assert after.error is None and after.text == "alive"


def test_javascript_typescript_bash_and_r(sbx):
    sbx.run_code("const base = 40", language="javascript")
    assert sbx.run_code("base + 2", language="javascript").text == "42"
    assert sbx.run_code("const t: number = 3; t * 2", language="typescript").text == "6"
    bash = sbx.run_code('echo "$(whoami) $BASH_RUN"', language="bash", envs={"BASH_RUN": "on"})
    assert bash.logs.stdout == ["root on\n"]
    # IRkernel shows a value as display data, not as the main result.
    assert sbx.run_code("1 + 2", language="r").results[0].text.strip() == "[1] 3"


def test_envs_per_run(sbx):
    assert sbx.run_code("import os\nos.environ['PER_RUN']", envs={"PER_RUN": "v"}).text == "v"
    assert sbx.run_code("import os\nos.environ.get('PER_RUN', 'gone')").text == "gone"


def test_contexts_are_isolated_restarted_and_removed(sbx):
    a = sbx.create_code_context()
    b = sbx.create_code_context(cwd="/tmp")
    assert (a.language, a.cwd, b.cwd) == ("python", "/home/user", "/tmp")
    # (Not `who`: IPython's automagic reads a bare `who` as %who once no variable has that name.)
    sbx.run_code("owner = 'a'", context=a)
    sbx.run_code("owner = 'b'", context=b)
    assert sbx.run_code("owner", context=a).text == "a"
    assert sbx.run_code("import os\n(owner, os.getcwd())", context=b).text == "('b', '/tmp')"
    listed = [c.id for c in sbx.list_code_contexts()]
    assert listed[-2:] == [a.id, b.id]

    sbx.restart_code_context(a)
    assert sbx.run_code("owner", context=a).error.name == "NameError"
    sbx.remove_code_context(a)
    sbx.remove_code_context(b.id)
    assert {a.id, b.id}.isdisjoint(c.id for c in sbx.list_code_contexts())
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=a)


def test_a_fresh_sandbox_lists_its_default_contexts():
    sandbox = Sandbox.create(allow_internet_access=False)
    try:
        contexts = sandbox.list_code_contexts()
        assert [c.language for c in contexts] == ["python", "javascript"]
        assert all(c.cwd == "/home/user" for c in contexts)
        assert sandbox.run_code("6 * 7", context=contexts[0]).text == "42"
    finally:
        sandbox.kill()


@pytest.mark.asyncio
async def test_async_charts_and_contexts(async_sbx):
    execution = await async_sbx.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2], [3, 4])\nplt.title('Async')\nplt.show()"
    )
    assert execution.results[0].chart.title == "Async"
    ctx = await async_sbx.create_code_context(language="javascript")
    assert ctx.language == "javascript"
    await async_sbx.run_code("let n = 1", context=ctx)
    assert (await async_sbx.run_code("n + 1", context=ctx)).text == "2"
    await async_sbx.remove_code_context(ctx)
    with pytest.raises(NotFoundException):
        await async_sbx.run_code("n", context=ctx)

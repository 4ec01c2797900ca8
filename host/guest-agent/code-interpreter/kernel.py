# Nestbox's code-interpreter kernel: one persistent python3 process per code context, so
# variables, imports and functions carry over from one cell to the next. It needs nothing but
# the standard library (no ipykernel, no network). It ships inside the guest agent, which
# starts it on POST /kernels (core's toolbox.startKernel; the E2B layer's code contexts are
# kernels); callers talk to it over its stdin/stdout through the process routes:
#
#   stdin  (one JSON object per line): {"id": "<cell id>", "code": "...", "env_vars": {...}}
#   stdout (one JSON object per line, each with "cell": "<cell id>"), in E2B's /execute shapes:
#     {"type": "number_of_executions", "execution_count": N}
#     {"type": "stdout" | "stderr", "text": "...", "timestamp": "..."}
#     {"type": "result", "is_main_result": bool, "text": ..., "html"?, "png"?, "json"?, ...}
#     {"type": "error", "name": ..., "value": ..., "traceback": "..."}
#     {"type": "end_of_execution"}
#
# What user code writes to file descriptors 1 and 2 (print, os.system, subprocesses) is read
# back through pipes and reported as stdout/stderr of the running cell; the protocol uses a
# private duplicate of the original stdout, so nothing the user does can corrupt it. SIGINT
# interrupts the running cell (KeyboardInterrupt) and leaves the context's state intact.
import ast
import base64
import codecs
import datetime
import json
import linecache
import os
import sys
import threading
import traceback

PROTOCOL = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
CELLS = os.fdopen(os.dup(0), "r", encoding="utf-8")
_devnull = os.open(os.devnull, os.O_RDONLY)
os.dup2(_devnull, 0)
os.close(_devnull)

_write_lock = threading.Lock()
_current_cell = [None]
# A byte sequence user output is very unlikely to contain: written after each cell so the
# readers know everything before it has been reported.
_MARKER = b"\x00\x01nestbox-kernel-sync\x01\x00"


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def emit(message, cell=None):
    message["cell"] = cell if cell is not None else _current_cell[0]
    line = json.dumps(message, default=str)
    with _write_lock:
        PROTOCOL.write(line + "\n")
        PROTOCOL.flush()


class _StreamCapture:
    """Reads a pipe that replaced fd 1 or 2 and reports its text as the running cell's output."""

    def __init__(self, fd, kind):
        self.kind = kind
        self.synced = threading.Event()
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self.read_end = read_end
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        threading.Thread(target=self._pump, daemon=True).start()

    def _report(self, data):
        text = self.decoder.decode(data)
        if text and _current_cell[0] is not None:
            emit({"type": self.kind, "text": text, "timestamp": _now()})

    def _pump(self):
        pending = b""
        while True:
            try:
                chunk = os.read(self.read_end, 65536)
            except InterruptedError:
                continue
            if not chunk:
                return
            pending += chunk
            while True:
                at = pending.find(_MARKER)
                if at == -1:
                    break
                self._report(pending[:at])
                pending = pending[at + len(_MARKER):]
                self.synced.set()
            # Hold back a tail that could be the start of a marker split across reads.
            keep = 0
            for size in range(min(len(_MARKER) - 1, len(pending)), 0, -1):
                if _MARKER.startswith(pending[-size:]):
                    keep = size
                    break
            self._report(pending[: len(pending) - keep])
            pending = pending[len(pending) - keep:]

    def sync(self, fd):
        self.synced.clear()
        os.write(fd, _MARKER)
        self.synced.wait(5)


_stdout_capture = _StreamCapture(1, "stdout")
_stderr_capture = _StreamCapture(2, "stderr")
sys.stdin = open(os.devnull, "r")
# The kernel runs under `python3 -u`, whose unbuffered sys.stdout/sys.stderr write print()'s
# text and its newline in two system calls, so one print arrived as two messages. Line-buffered
# streams over the same descriptors write a whole line at once (a line is one message, as
# Jupyter coalesces a print into one stream message); what is written without a newline still
# goes out at the latest when the cell ends (run_cell flushes both).
sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)
sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)

NAMESPACE = {"__name__": "__main__", "__builtins__": __builtins__}
_execution_count = [0]

_REPR_METHODS = (
    ("_repr_html_", "html"),
    ("_repr_markdown_", "markdown"),
    ("_repr_svg_", "svg"),
    ("_repr_png_", "png"),
    ("_repr_jpeg_", "jpeg"),
    ("_repr_latex_", "latex"),
    ("_repr_json_", "json"),
    ("_repr_javascript_", "javascript"),
)


def _result(value, is_main):
    message = {"type": "result", "is_main_result": is_main}
    for method, key in _REPR_METHODS:
        function = getattr(value, method, None)
        if not callable(function):
            continue
        try:
            produced = function()
        except Exception:
            continue
        if produced is None:
            continue
        if isinstance(produced, tuple):
            produced = produced[0]
        if key in ("png", "jpeg") and isinstance(produced, (bytes, bytearray)):
            produced = base64.b64encode(produced).decode("ascii")
        message[key] = produced
    text = repr(value)
    # Jupyter's text/plain of a string keeps its quotes; E2B strips them (e2b.md (e)).
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    message["text"] = text
    return message


def _emit_figures():
    """Open matplotlib figures become PNG display results (only if matplotlib is installed and used)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        import io

        for number in pyplot.get_fignums():
            figure = pyplot.figure(number)
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", bbox_inches="tight")
            emit({"type": "result", "is_main_result": False, "text": repr(figure), "png": base64.b64encode(buffer.getvalue()).decode("ascii")})
        pyplot.close("all")
    except Exception as error:  # a figure that cannot render must not lose the cell's result
        emit({"type": "stderr", "text": "could not render a figure: %r\n" % (error,), "timestamp": _now()})


def _error(error, filename):
    if isinstance(error, SyntaxError):
        lines = traceback.format_exception_only(type(error), error)
    else:
        # Drop the kernel's own frames: the traceback starts in the user's cell.
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != filename:
            tb = tb.tb_next
        lines = traceback.format_exception(type(error), error, tb)
    return {"type": "error", "name": type(error).__name__, "value": str(error), "traceback": "".join(lines)}


def run_cell(cell):
    _current_cell[0] = cell.get("id")
    _execution_count[0] += 1
    count = _execution_count[0]
    emit({"type": "number_of_executions", "execution_count": count})
    filename = "<cell-%d>" % count
    code = cell.get("code") or ""
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    saved_env = {}
    for name, value in (cell.get("env_vars") or {}).items():
        saved_env[name] = os.environ.get(name)
        os.environ[name] = str(value)
    try:
        tree = ast.parse(code, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, "exec"), NAMESPACE)
        value = eval(compile(last, filename, "eval"), NAMESPACE) if last is not None else None
        _emit_figures()
        if value is not None:
            NAMESPACE["_"] = value
            emit(_result(value, True))
    except BaseException as error:  # KeyboardInterrupt and SystemExit end the cell, not the kernel
        emit(_error(error, filename))
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        _stdout_capture.sync(1)
        _stderr_capture.sync(2)
        emit({"type": "end_of_execution"})
        _current_cell[0] = None


def main():
    emit({"type": "ready"}, cell="")
    while True:
        try:
            line = CELLS.readline()
            if not line:
                return
            if not line.strip():
                continue
            run_cell(json.loads(line))
        except KeyboardInterrupt:
            # An interrupt that arrives between cells has nothing to stop.
            continue


main()

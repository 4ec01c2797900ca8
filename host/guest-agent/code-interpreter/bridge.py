# Nestbox's Jupyter kernel bridge: one process per code context. It starts a real Jupyter kernel
# for the context's language with jupyter_client (the kernelspec python3 → IPython, deno →
# JavaScript/TypeScript, bash → bash_kernel, ir → IRkernel), and speaks a line protocol with the
# guest agent over its own stdin/stdout (POST /kernels starts it; host/agent-protocol/processes.ts
# documents the wire):
#
#   stdin, one JSON object per line:
#     {"id": "<cell id>", "code": "...", "env_vars": {...}}   a cell, run after the ones before it
#     {"interrupt": "<cell id>"}                             interrupt that cell (dropped if queued)
#   stdout, one JSON object per line, each naming its cell ("cell"), in the CodeEvent shapes of
#   core/code-interpreter/types.ts:
#     {"type": "start", "executionCount": N}                 Jupyter's execute_input
#     {"type": "stdout" | "stderr", "text": "..."}           one per Jupyter stream message
#     {"type": "result", "main": bool, "data": {mime: ...}}  execute_result / display_data
#     {"type": "error", "name", "value", "traceback"}        the traceback's lines joined by "\n"
#     {"type": "end", "status": "ok"|"error"|"interrupted"|"lost", "executionCount"?: N}
#   Lines with "cell": null are about the bridge itself: {"type": "ready", "language": …} once the
#   kernel answered and its hooks are in (the guest agent answers POST /kernels then), and
#   {"type": "fatal", "message": "..."} when the kernel could not start (the bridge then exits 2).
#
# SIGINT interrupts the running cell (KernelManager.interrupt_kernel, the kernel's own interrupt
# mode). The kernel runs in its own session (jupyter_client's choice), so a signal the guest agent
# sends to the bridge's process group reaches the kernel exactly once, through us. The kernel
# dies with the bridge (PR_SET_PDEATHSIG), so the guest agent's SIGKILL of the bridge's group
# (DELETE /processes/{id}) ends it too. A kernel that
# does not stop within the interrupt grace after an interrupt is killed: the cell ends `lost`.
# A kernel that dies during a cell ends it `lost` and the bridge exits (its context's next cell
# starts a new kernel). With no cell for the idle timeout, the kernel is shut down and the bridge
# exits 0. SIGTERM shuts the kernel and its process group down, then the bridge dies of the
# SIGTERM (a deliberate stop); SIGHUP does the same but exits 129 (as if on its own). A run's env_vars are set before the cell and restored after it, by silent executions
# in the kernel's own language (they do not count as executions).
#
# `--probe` prints {"languages": [...], "missing": {language: reason}} for this machine instead.
import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

# The kernelspecs each language can use, in order of preference.
KERNEL_NAMES = {
    "python": ("python3",),
    "javascript": ("deno",),
    "typescript": ("deno",),
    "bash": ("bash",),
    "r": ("ir",),
}

# The display hooks' source (python_display.py), put here by the guest agent's bundling.
PYTHON_DISPLAY_HOOKS = __NESTBOX_PYTHON_DISPLAY__  # noqa: F821

# How long the kernel may take to start and answer kernel_info.
START_TIMEOUT_SECONDS = 60
# How long one silent execution (display hooks, envs) may take.
SILENT_TIMEOUT_SECONDS = 30
# How long the execute_reply may lag behind the idle status that ended a cell's output.
REPLY_TIMEOUT_SECONDS = 10
# Kernels that publish some of a cell's output after its idle status (Deno: console output,
# seen 160 ms late on a busy machine): the cell ends once they have said nothing more for this
# long after it, or at LATE_OUTPUT_MAX_SECONDS.
LATE_OUTPUT_QUIET_SECONDS = {"javascript": 0.4, "typescript": 0.4}
LATE_OUTPUT_MAX_SECONDS = 5


def log(text):
    sys.stderr.write(f"nestbox kernel bridge: {text}\n")
    sys.stderr.flush()


def find_spec(language):
    """(kernelspec name, spec) for the language, or (None, reason)."""
    try:
        from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except ImportError as error:
        return None, f"jupyter_client is not installed ({error})"
    manager = KernelSpecManager()
    for name in KERNEL_NAMES[language]:
        try:
            spec = manager.get_kernel_spec(name)
        except NoSuchKernel:
            continue
        except Exception as error:  # a broken kernel.json
            return None, f"kernelspec {name} is unreadable ({error})"
        program = spec.argv[0] if spec.argv else ""
        if program and (shutil.which(program) or (os.path.isabs(program) and os.access(program, os.X_OK))):
            return name, spec
        return None, f"kernelspec {name} runs {program!r}, which is not installed"
    return None, f"no Jupyter kernelspec named {' or '.join(KERNEL_NAMES[language])}"


def probe():
    languages, missing = [], {}
    for language in KERNEL_NAMES:
        name, detail = find_spec(language)
        if name:
            languages.append(language)
        else:
            missing[language] = detail
    sys.stdout.write(json.dumps({"languages": languages, "missing": missing}) + "\n")
    sys.stdout.flush()


# ---- environment of one run, per language --------------------------------------------------------


def _bash_quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


def _identifier(name):
    return name.isidentifier() and name.isascii()


def env_set_code(language, envs):
    encoded = json.dumps(envs, ensure_ascii=True)
    if language == "python":
        return (
            "(lambda o, e: (o.__dict__.setdefault('_nestbox_saved_env', []).append({k: o.environ.get(k) for k in e}),"
            f" o.environ.update(e)))(__import__('os'), {encoded})"
        )
    if language in ("javascript", "typescript"):
        return (
            f"{{ const e = {encoded}; const g = globalThis; g.__nestboxSavedEnv ??= [];"
            " g.__nestboxSavedEnv.push(Object.fromEntries(Object.keys(e).map((k) => [k, Deno.env.get(k)])));"
            " for (const [k, v] of Object.entries(e)) Deno.env.set(k, v); }"
        )
    if language == "bash":
        lines = []
        for key, value in envs.items():
            if not _identifier(key):
                continue
            lines.append(
                f'if [ "${{{key}+set}}" = set ]; then __nestbox_saved_{key}="${key}"; __nestbox_had_{key}=1; else __nestbox_had_{key}=0; fi;'
                f" export {key}={_bash_quote(value)}"
            )
        return "\n".join(lines)
    if language == "r":
        names = ", ".join(json.dumps(k, ensure_ascii=True) for k in envs)
        values = ", ".join(json.dumps(v, ensure_ascii=True) for v in envs.values())
        return (
            f"local({{ e <- setNames(c({values}), c({names})); old <- Sys.getenv(names(e), unset = NA, names = TRUE);"
            " assign('.nestbox_saved_env', c(list(old), get0('.nestbox_saved_env', envir = globalenv(), ifnotfound = list())), envir = globalenv());"
            " do.call(Sys.setenv, as.list(e)) }); invisible(NULL)"
        )
    return ""


def env_restore_code(language, envs):
    if language == "python":
        return (
            "(lambda o: [o.environ.pop(k, None) if v is None else o.environ.__setitem__(k, v)"
            " for k, v in o.__dict__['_nestbox_saved_env'].pop().items()])(__import__('os'))"
        )
    if language in ("javascript", "typescript"):
        return (
            "{ const saved = globalThis.__nestboxSavedEnv.pop();"
            " for (const [k, v] of Object.entries(saved)) { if (v === undefined) Deno.env.delete(k); else Deno.env.set(k, v); } }"
        )
    if language == "bash":
        lines = []
        for key in envs:
            if not _identifier(key):
                continue
            lines.append(
                f'if [ "$__nestbox_had_{key}" = 1 ]; then export {key}="$__nestbox_saved_{key}"; else unset {key}; fi;'
                f" unset __nestbox_saved_{key} __nestbox_had_{key}"
            )
        return "\n".join(lines)
    if language == "r":
        return (
            "local({ s <- get('.nestbox_saved_env', envir = globalenv()); old <- s[[1]];"
            " assign('.nestbox_saved_env', s[-1], envir = globalenv());"
            " for (k in names(old)) if (is.na(old[[k]])) Sys.unsetenv(k) else do.call(Sys.setenv, setNames(list(old[[k]]), k)) });"
            " invisible(NULL)"
        )
    return ""


def die_with_parent():
    """In the kernel's child before exec: SIGKILL when the bridge dies (prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


def display_hooks_code():
    return (
        "import sys as _nb_sys, types as _nb_types\n"
        "_nb_module = _nb_types.ModuleType('nestbox_display')\n"
        "_nb_sys.modules['nestbox_display'] = _nb_module\n"
        f"exec(compile({json.dumps(PYTHON_DISPLAY_HOOKS)}, 'nestbox_display', 'exec'), _nb_module.__dict__)\n"
        "del _nb_sys, _nb_types, _nb_module\n"
    )


# ---- the bridge ------------------------------------------------------------------------------------


class KernelLost(Exception):
    pass


class Bridge:
    def __init__(self, language, protocol, interrupt_grace):
        self.language = language
        self.protocol = protocol
        self.interrupt_grace = interrupt_grace
        self.write_lock = threading.Lock()
        # Reentrant: the SIGINT handler runs on the main thread, possibly inside a `with` of it.
        self.state_lock = threading.RLock()
        self.cells = queue.Queue()
        self.current = None
        self.interrupt_pending = False
        self.dropped = set()
        self.execution_count = 0
        self.km = None
        self.kc = None
        self.late_output_seconds = LATE_OUTPUT_QUIET_SECONDS.get(language, 0)
        self.kernel_log = None

    # -- output --

    def emit(self, cell, event):
        line = json.dumps({"cell": cell, **event}, ensure_ascii=True, default=str)
        with self.write_lock:
            self.protocol.write(line + "\n")
            self.protocol.flush()

    # -- input (a thread) --

    def read_stdin(self):
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            try:
                message = json.loads(line)
            except ValueError:
                log(f"ignored a line that is not JSON: {line[:80]!r}")
                continue
            if not isinstance(message, dict):
                continue
            if "interrupt" in message:
                self.request_interrupt(str(message["interrupt"]))
            elif isinstance(message.get("id"), str):
                self.cells.put(message)
        self.cells.put(None)  # stdin closed: the agent is done with this kernel

    def request_interrupt(self, cell=None):
        with self.state_lock:
            if self.current is not None and (cell is None or cell == self.current):
                self.interrupt_pending = True
            elif cell is not None:
                self.dropped.add(cell)

    # -- the kernel --

    def start_kernel(self):
        from jupyter_client.manager import KernelManager

        name, spec = find_spec(self.language)
        if not name:
            raise RuntimeError(f"this image has no Jupyter kernel for {self.language}: {spec}")
        env = dict(os.environ)
        if self.language == "python":
            # plt.show() and figures left open at the end of a cell become PNG display_data.
            env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
            # ipykernel's debugger support warns about frozen modules on every start.
            env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        self.km = KernelManager(kernel_name=name)
        # The kernel's own stdout and stderr (its start-up messages; cell output travels on
        # IOPub) go to a log file, quoted on our stderr when the kernel dies: not to our pipes,
        # which the kernel and everything it starts would otherwise hold open after we are gone
        # (the guest agent counts a process as running until its pipes close).
        self.kernel_log = open(os.path.join(os.environ["JUPYTER_RUNTIME_DIR"], "kernel.log"), "w+b")
        self.km.start_kernel(cwd=os.getcwd(), env=env, stdin=subprocess.DEVNULL, stdout=self.kernel_log, stderr=self.kernel_log, preexec_fn=die_with_parent)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=START_TIMEOUT_SECONDS)
        self.await_iopub()
        if self.language == "python":
            status = self.silent(display_hooks_code())
            if status != "ok":
                log("the display hooks did not install; results carry the kernel's own formats only")

    def await_iopub(self):
        """Until the kernel's status messages reach us: output published before is lost to us."""
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            msg_id = self.kc.kernel_info()
            until = time.monotonic() + 1.0
            while time.monotonic() < until:
                try:
                    message = self.kc.get_iopub_msg(timeout=0.2)
                except queue.Empty:
                    continue
                if message["parent_header"].get("msg_id") == msg_id:
                    self.drain_shell()
                    return
            self.check_alive()
        raise RuntimeError("the kernel's IOPub channel did not connect")

    def drain_shell(self):
        while True:
            try:
                self.kc.get_shell_msg(timeout=0.05)
            except queue.Empty:
                return

    def quote_kernel_log(self):
        """The end of what the kernel itself printed, on our stderr (the sandbox's diagnostics)."""
        if self.kernel_log is None:
            return
        try:
            self.kernel_log.flush()
            size = os.fstat(self.kernel_log.fileno()).st_size
            self.kernel_log.seek(max(0, size - 4096))
            text = self.kernel_log.read().decode("utf-8", "replace").strip()
            if text:
                log(f"the kernel's own output:\n{text}")
        except OSError:
            pass

    def check_alive(self):
        if not self.km.is_alive():
            raise KernelLost()

    def shutdown(self):
        if self.km is None:
            return
        pgid = getattr(getattr(self.km, "provisioner", None), "pgid", None)
        try:
            if self.kc is not None:
                self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)
        except Exception as error:
            log(f"shutting the kernel down: {error}")
        # What the kernel started (a `!sleep` of a cell) is in its process group: gone with it.
        if pgid and pgid > 1:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass

    def silent(self, code):
        """Runs code that is not a cell: no history, no execution count, no output for anyone."""
        if not code:
            return "ok"
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False, stop_on_error=False)
        deadline = time.monotonic() + SILENT_TIMEOUT_SECONDS
        last_alive_check = time.monotonic()
        status = "ok"
        while True:
            if time.monotonic() > deadline:
                log("a silent execution did not finish in time")
                return "error"
            try:
                message = self.kc.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                if time.monotonic() - last_alive_check > 0.5:
                    last_alive_check = time.monotonic()
                    self.check_alive()
                continue
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "error":
                status = "error"
                log(f"silent execution failed: {content.get('ename')}: {content.get('evalue')}")
            elif kind == "status" and content.get("execution_state") == "idle":
                break
        self.reply_to(msg_id)
        return status

    def reply_to(self, msg_id):
        deadline = time.monotonic() + REPLY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            try:
                message = self.kc.get_shell_msg(timeout=0.2)
            except queue.Empty:
                self.check_alive()
                continue
            if message["parent_header"].get("msg_id") == msg_id:
                return message["content"]
        return None

    # -- cells --

    def run_cell(self, cell):
        cell_id = cell["id"]
        code = cell.get("code") if isinstance(cell.get("code"), str) else ""
        envs = cell.get("env_vars") if isinstance(cell.get("env_vars"), dict) else {}
        envs = {str(k): str(v) for k, v in envs.items()}
        with self.state_lock:
            if cell_id in self.dropped:
                self.dropped.discard(cell_id)
                self.emit(cell_id, {"type": "end", "status": "interrupted"})
                return
            self.current = cell_id
            self.interrupt_pending = False
        try:
            if envs:
                self.silent(env_set_code(self.language, envs))
            status = self.follow(cell_id, self.kc.execute(code, silent=False, store_history=True, allow_stdin=False, stop_on_error=False))
            if envs:
                self.silent(env_restore_code(self.language, envs))
        finally:
            with self.state_lock:
                self.current = None
                self.interrupt_pending = False
        return status

    def follow(self, cell_id, msg_id):
        started = False
        interrupted_at = None
        last_alive_check = time.monotonic()

        def start(count=None):
            nonlocal started
            if started:
                return
            started = True
            if isinstance(count, int):
                self.execution_count = count
            else:
                self.execution_count += 1
            self.emit(cell_id, {"type": "start", "executionCount": self.execution_count})

        while True:
            if self.interrupt_pending and interrupted_at is None:
                interrupted_at = time.monotonic()
                try:
                    self.km.interrupt_kernel()
                except Exception as error:
                    log(f"interrupting the kernel: {error}")
            if interrupted_at is not None and time.monotonic() - interrupted_at > self.interrupt_grace:
                log(f"the kernel did not stop within {self.interrupt_grace:g} s of the interrupt; killing it")
                start()
                self.emit(cell_id, {"type": "end", "status": "lost"})
                raise KernelLost()
            try:
                message = self.kc.get_iopub_msg(timeout=0.1)
            except queue.Empty:
                if time.monotonic() - last_alive_check > 0.5:
                    last_alive_check = time.monotonic()
                    if not self.km.is_alive():
                        start()
                        self.emit(cell_id, {"type": "end", "status": "lost"})
                        raise KernelLost()
                continue
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            if self.relay(cell_id, message, start):
                break
        if self.late_output_seconds > 0:
            # Output the kernel published after it said idle (Deno forwards a cell's console
            # output asynchronously): relayed until the kernel has been quiet for a moment.
            quiet_until = time.monotonic() + self.late_output_seconds
            give_up = time.monotonic() + LATE_OUTPUT_MAX_SECONDS
            while time.monotonic() < min(quiet_until, give_up):
                try:
                    message = self.kc.get_iopub_msg(timeout=max(0.01, quiet_until - time.monotonic()))
                except queue.Empty:
                    break
                if message["parent_header"].get("msg_id") == msg_id:
                    self.relay(cell_id, message, start)
                    quiet_until = time.monotonic() + self.late_output_seconds
        start()
        reply = self.reply_to(msg_id) or {}
        count = reply.get("execution_count")
        if isinstance(count, int):
            self.execution_count = count
        state = reply.get("status")
        if interrupted_at is not None and state != "ok":
            status = "interrupted"
        elif state == "ok":
            status = "ok"
        elif state == "aborted":
            status = "interrupted"
        else:
            status = "error"
        self.emit(cell_id, {"type": "end", "status": status, "executionCount": self.execution_count})
        return status

    def relay(self, cell_id, message, start):
        """Passes one of the cell's IOPub messages on as its event; True for the idle status."""
        kind, content = message["msg_type"], message["content"]
        if kind == "execute_input":
            start(content.get("execution_count"))
        elif kind == "stream":
            start()
            self.emit(cell_id, {"type": "stderr" if content.get("name") == "stderr" else "stdout", "text": content.get("text", "")})
        elif kind in ("execute_result", "display_data", "update_display_data"):
            start()
            self.emit(cell_id, {"type": "result", "main": kind == "execute_result", "data": content.get("data", {})})
        elif kind == "error":
            start()
            traceback = content.get("traceback") or []
            self.emit(cell_id, {"type": "error", "name": content.get("ename", ""), "value": content.get("evalue", ""), "traceback": "\n".join(traceback)})
        elif kind == "status" and content.get("execution_state") == "idle":
            return True
        return False

    def serve(self, idle_timeout):
        threading.Thread(target=self.read_stdin, daemon=True).start()
        while True:
            try:
                cell = self.cells.get(timeout=idle_timeout if idle_timeout > 0 else None)
            except queue.Empty:
                log(f"no cell for {idle_timeout:g} s: shutting the kernel down")
                return 0
            if cell is None:
                return 0
            try:
                self.run_cell(cell)
            except KernelLost:
                log("the kernel died; its context's next cell starts a new one")
                self.quote_kernel_log()
                return 1


def main():
    parser = argparse.ArgumentParser(prog="nestbox-kernel-bridge")
    parser.add_argument("--probe", action="store_true")
    parser.add_argument("--language", choices=sorted(KERNEL_NAMES), default="python")
    parser.add_argument("--idle-timeout", type=float, default=3600.0)
    parser.add_argument("--interrupt-grace", type=float, default=10.0)
    args = parser.parse_args()
    if args.probe:
        probe()
        return 0

    # The protocol gets a private duplicate of stdout; fd 1 itself goes to stderr, so nothing
    # else in this process (jupyter_client, a library's print) can corrupt it.
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    runtime_dir = tempfile.mkdtemp(prefix="nestbox-kernel-")
    os.environ["JUPYTER_RUNTIME_DIR"] = runtime_dir

    bridge = Bridge(args.language, protocol, args.interrupt_grace)
    signal.signal(signal.SIGINT, lambda *_: bridge.request_interrupt())

    terminated_by = []

    def terminate(signum, _frame):
        # Once: a second signal must not cut the kernel's shutdown short.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        terminated_by.append(signum)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGHUP, terminate)
    try:
        try:
            bridge.start_kernel()
        except Exception as error:
            message = str(error) or type(error).__name__
            log(f"the kernel did not start: {message}")
            bridge.quote_kernel_log()
            bridge.emit(None, {"type": "fatal", "message": message})
            return 2
        bridge.emit(None, {"type": "ready", "language": args.language})
        return bridge.serve(args.idle_timeout)
    finally:
        bridge.shutdown()
        shutil.rmtree(runtime_dir, ignore_errors=True)
        if terminated_by and terminated_by[0] == signal.SIGTERM:
            # Stopped on request (core deleting the context): the bridge dies of the signal once
            # its kernel and everything the kernel started are gone, so the guest agent records
            # it as killed (the context is gone) rather than as a kernel that exited on its own.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main())

# Nestbox's one-shot python runner (POST /scripts, Daytona's codeRun): runs the program it reads
# on stdin once, as __main__, with the arguments after ours as sys.argv[1:] (sys.argv[0] is
# "-c", as for `python3 -c`). The guest agent merges stdout and stderr into one pipe.
#
# matplotlib gets the Agg backend (no display), and plt.show() reports every figure it has not
# reported yet on one marker line each, then closes them as a non-interactive show would:
#
#   <marker> {"chart": <E2B chart JSON or null>, "png": "<base64>"}
#
# The marker (a line prefix) comes from the environment variable NESTBOX_CHART_MARKER, chosen
# per run by the guest agent, so program output cannot forge one; the typed guest client strips
# these lines from the output (host/agent-protocol/guest-client.ts, runScript).
import base64
import io
import json
import os
import sys
import types

# The display hooks' source (python_display.py), put here by the guest agent's bundling.
PYTHON_DISPLAY_HOOKS = __NESTBOX_PYTHON_DISPLAY__  # noqa: F821

MARKER = os.environ.pop("NESTBOX_CHART_MARKER", "")


def load_display_module():
    module = types.ModuleType("nestbox_display")
    exec(compile(PYTHON_DISPLAY_HOOKS, "nestbox_display", "exec"), module.__dict__)
    return module


def install_show_hook(display):
    """Wraps plt.show once matplotlib.pyplot is imported (nothing is imported before that)."""
    import importlib.abc
    import importlib.machinery

    reported = set()

    def report_figures():
        import matplotlib.pyplot as plt

        for number in plt.get_fignums():
            figure = plt.figure(number)
            if id(figure) in reported:
                continue
            reported.add(id(figure))
            buffer = io.BytesIO()
            try:
                figure.savefig(buffer, format="png", bbox_inches="tight")
                png = base64.b64encode(buffer.getvalue()).decode("ascii")
            except Exception:
                png = None
            line = json.dumps({"chart": display.figure_chart(figure), "png": png}, default=str)
            sys.stdout.flush()
            sys.stdout.write(f"\n{MARKER} {line}\n" if MARKER else "")
            sys.stdout.flush()
        plt.close("all")

    def patch(pyplot):
        original = pyplot.show

        def show(*args, **kwargs):
            report_figures()
            return None

        show.__wrapped__ = original
        show.__doc__ = original.__doc__
        pyplot.show = show

    class PyplotWatcher(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != "matplotlib.pyplot":
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or spec.loader is None:
                return spec
            loader = spec.loader
            original_exec = loader.exec_module

            def exec_module(module):
                original_exec(module)
                try:
                    patch(module)
                except Exception:
                    pass

            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, PyplotWatcher())


def main():
    code = sys.stdin.read()
    # The program gets an empty stdin of its own, as a `python3 -c` started without input would.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, "r", closefd=False)
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        install_show_hook(load_display_module())
    except Exception:
        pass
    sys.argv = ["-c", *sys.argv[1:]]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__, "__doc__": None, "__spec__": None}
    sys.modules["__main__"] = types.ModuleType("__main__")
    sys.modules["__main__"].__dict__.update(namespace)
    try:
        exec(compile(code, "<string>", "exec"), sys.modules["__main__"].__dict__)
    except SystemExit:
        raise
    except BaseException as error:
        # The traceback python itself would print for `python3 -c`: without this runner's frame.
        import traceback

        traceback.print_exception(type(error), error, error.__traceback__.tb_next if error.__traceback__ else None)
        sys.stderr.flush()
        sys.exit(130 if isinstance(error, KeyboardInterrupt) else 1)


if __name__ == "__main__":
    main()

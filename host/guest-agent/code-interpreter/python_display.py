# Nestbox's display hooks for IPython kernels. The kernel bridge (bridge.py) runs this module
# silently in every new python kernel, as the module `nestbox_display` (nothing lands in the
# user's namespace). It adds two MIME types to the display formatter, so every result bundle
# (execute_result and display_data) of these objects carries them next to IPython's own:
#
#   application/vnd.nestbox.chart+json      a matplotlib Figure as chart data (E2B's chart JSON:
#                                           line, scatter, bar, pie, box_and_whisker,
#                                           superchart, unknown; see core/code-interpreter/types.ts)
#   application/vnd.nestbox.dataframe+json  a pandas DataFrame as to_dict(orient="list"),
#                                           timestamps as ISO strings, NaN/NaT as null
#
# Both match their class by name, so neither matplotlib nor pandas is imported until the user
# imports them. Figures themselves render through matplotlib's inline backend (the bridge
# sets MPLBACKEND to it): plt.show() and a figure left open at the end of a cell become
# display_data with image/png. Any failure while extracting gives no entry, never an error the
# user sees (an exception in a formatter would print a traceback into the cell).
import builtins
import datetime
import io
import math
import os
import re
import sys

CHART_MIME = "application/vnd.nestbox.chart+json"
DATAFRAME_MIME = "application/vnd.nestbox.dataframe+json"

# A unit in an axis label: "time (s)" or "distance [km]".
_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def _json_value(value):
    """One cell of data as a JSON value: numbers finite or null, dates ISO, the rest text."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if str(value) in ("NaT", "<NA>"):  # pandas' missing values (NaT is also a datetime)
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        try:
            return value.isoformat()
        except ValueError:  # pandas' NaT is a datetime whose isoformat is "NaT"
            return None
    module = type(value).__module__ or ""
    if module.startswith("pandas"):
        text = str(value)
        if text in ("NaT", "nan", "<NA>"):
            return None
        isoformat = getattr(value, "isoformat", None)
        if callable(isoformat):
            return isoformat()
        return text
    if module.startswith("numpy"):
        kind = getattr(getattr(value, "dtype", None), "kind", "")
        if kind == "M":  # datetime64
            if str(value) == "NaT":
                return None
            return str(value.astype("datetime64[us]")).replace(" ", "T")
        item = getattr(value, "item", None)
        if callable(item):
            converted = item()
            if converted is not value and not type(converted).__module__.startswith("numpy"):
                return _json_value(converted)
    return str(value)


def _dataframe_data(frame):
    try:
        return {str(column): [_json_value(v) for v in values] for column, values in frame.to_dict(orient="list").items()}
    except Exception:
        return None


# ---- charts -------------------------------------------------------------------------------------


def _text_or_none(text):
    return text if text else None


def _unit_of(label):
    if not label:
        return None
    match = _UNIT.search(label)
    if not match:
        return None
    return match.group(1) if match.group(1) is not None else match.group(2)


def _converter(axis):
    getter = getattr(axis, "get_converter", None)
    return getter() if callable(getter) else getattr(axis, "converter", None)


def _is_date_axis(axis):
    import matplotlib.dates as mdates

    kinds = tuple(k for k in (getattr(mdates, name, None) for name in ("DateConverter", "ConciseDateConverter", "_SwitchableDateConverter")) if isinstance(k, type))
    return isinstance(_converter(axis), kinds)


def _is_category_axis(axis):
    import matplotlib.category as mcategory

    return isinstance(_converter(axis), mcategory.StrCategoryConverter)


def _scale_of(axis, scale):
    if _is_date_axis(axis):
        return "datetime"
    if scale != "linear":
        return scale
    if _is_category_axis(axis):
        return "categorical"
    return "linear"


def _number(value):
    number = float(value)
    return number if math.isfinite(number) else None


def _coordinate(value, date_axis):
    """A point's coordinate: a float, an ISO date on a date axis, or the category's text."""
    import matplotlib.dates as mdates

    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    kind = getattr(getattr(value, "dtype", None), "kind", "")
    if kind == "M":
        return str(value.astype("datetime64[s]"))
    if isinstance(value, str):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if not math.isfinite(number):
        return None
    if date_axis:
        return mdates.num2date(number).isoformat()
    return number


def _ticks(axis, date_axis):
    import matplotlib.dates as mdates

    locations = list(axis.get_majorticklocs())
    if date_axis:
        return [mdates.num2date(t).isoformat() for t in locations]
    return [_number(t) for t in locations]


def _tick_labels(axis):
    return [label.get_text() for label in axis.get_majorticklabels()]


def _position_label(axis, position):
    """The tick label at a bar's or box's position (a category's name), else the position itself."""
    for location, label in zip(axis.get_majorticklocs(), _tick_labels(axis)):
        if math.isclose(float(location), float(position), rel_tol=1e-9, abs_tol=1e-9):
            return label
    number = float(position)
    return str(int(number)) if number.is_integer() else repr(number)


def _is_rule_line(line):
    """A straight horizontal or vertical two-point line (axhline, axvline, grids): not a series."""
    x, y = line.get_xdata(), line.get_ydata()
    if len(x) != 2 or len(y) != 2:
        return False
    return x[0] == x[1] or y[0] == y[1]


def _artists(ax):
    from matplotlib.text import Text

    children = getattr(ax, "_children", None)
    if children is None:
        children = [*ax.lines, *ax.patches, *ax.collections, *ax.images, *ax.texts]
    return [child for child in children if not isinstance(child, Text)]


def _kind_of(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge

    artists = _artists(ax)
    if all(isinstance(a, Line2D) for a in artists):
        return "line"
    if any(isinstance(a, PathPatch) for a in artists) and all(isinstance(a, (PathPatch, Line2D)) for a in artists):
        return "box_and_whisker"
    artists = [a for a in artists if not (isinstance(a, Line2D) and _is_rule_line(a))]
    if all(isinstance(a, PathCollection) for a in artists):
        return "scatter"
    if all(isinstance(a, Wedge) for a in artists):
        return "pie"
    if all(isinstance(a, Rectangle) for a in artists):
        return "bar"
    return "unknown"


def _axes_labels(ax):
    x_label, y_label = _text_or_none(ax.get_xlabel()), _text_or_none(ax.get_ylabel())
    return {"x_label": x_label, "y_label": y_label, "x_unit": _unit_of(x_label), "y_unit": _unit_of(y_label)}


def _swap_axes_labels(chart):
    chart["x_label"], chart["y_label"] = chart["y_label"], chart["x_label"]
    chart["x_unit"], chart["y_unit"] = chart["y_unit"], chart["x_unit"]


def _point_chart(ax, kind):
    x_date, y_date = _is_date_axis(ax.xaxis), _is_date_axis(ax.yaxis)
    chart = {
        "type": kind,
        "title": _text_or_none(ax.get_title()),
        **_axes_labels(ax),
        "x_ticks": _ticks(ax.xaxis, x_date),
        "x_tick_labels": _tick_labels(ax.xaxis),
        "x_scale": _scale_of(ax.xaxis, ax.get_xscale()),
        "y_ticks": _ticks(ax.yaxis, y_date),
        "y_tick_labels": _tick_labels(ax.yaxis),
        "y_scale": _scale_of(ax.yaxis, ax.get_yscale()),
        "elements": [],
    }
    if kind == "line":
        for line in ax.get_lines():
            if _is_rule_line(line):
                continue
            label = str(line.get_label())
            if re.fullmatch(r"_child\d+", label):
                label = f"Line {int(label[6:])}"
            points = [[_coordinate(x, x_date), _coordinate(y, y_date)] for x, y in zip(line.get_xdata(), line.get_ydata())]
            chart["elements"].append({"label": label, "points": points})
    else:
        for collection in ax.collections:
            points = [[_coordinate(x, x_date), _coordinate(y, y_date)] for x, y in collection.get_offsets()]
            chart["elements"].append({"label": str(collection.get_label()), "points": points})
    return chart


def _bar_chart(ax):
    from matplotlib.container import BarContainer

    chart = {"type": "bar", "title": _text_or_none(ax.get_title()), **_axes_labels(ax), "elements": []}
    swapped = False
    for container in ax.containers:
        if not isinstance(container, BarContainer):
            continue
        group = str(container.get_label())
        if re.fullmatch(r"_container\d+", group):
            group = f"Group {int(group[10:])}"
        rectangles = list(container)
        orientation = getattr(container, "orientation", None)
        if orientation not in ("vertical", "horizontal"):
            heights = [r.get_height() for r in rectangles]
            orientation = "horizontal" if heights and all(math.isclose(h, heights[0], rel_tol=1e-6) for h in heights) else "vertical"
        if orientation == "horizontal" and not swapped:
            # Categories run along y: report them as the chart's x (E2B's convention).
            _swap_axes_labels(chart)
            swapped = True
        for rectangle in rectangles:
            if orientation == "vertical":
                label = _position_label(ax.xaxis, rectangle.get_x() + rectangle.get_width() / 2)
                value = rectangle.get_height()
            else:
                label = _position_label(ax.yaxis, rectangle.get_y() + rectangle.get_height() / 2)
                value = rectangle.get_width()
            chart["elements"].append({"label": label, "group": group, "value": _number(value)})
    return chart


def _pie_chart(ax):
    from matplotlib.patches import Wedge

    elements = []
    for wedge in ax.patches:
        if isinstance(wedge, Wedge):
            elements.append({"label": str(wedge.get_label()), "angle": abs(round(float(wedge.theta2 - wedge.theta1), 4)), "radius": _number(wedge.r)})
    return {"type": "pie", "title": _text_or_none(ax.get_title()), "elements": elements}


def _round(value):
    """Drops float noise of path vertices (84.75000000000001 → 84.75)."""
    return float(f"{float(value):.10g}")


def _box_chart(ax):
    from matplotlib.patches import PathPatch

    chart = {"type": "box_and_whisker", "title": _text_or_none(ax.get_title()), **_axes_labels(ax), "elements": []}
    boxes = []
    for patch in ax.patches:
        if not isinstance(patch, PathPatch):
            continue
        vertices = patch.get_path().vertices
        xs, ys = [_round(v) for v in vertices[:, 0]], [_round(v) for v in vertices[:, 1]]
        boxes.append({"x": (min(xs), max(xs)), "y": (min(ys), max(ys))})
    if not boxes:
        return chart
    widths = [b["x"][1] - b["x"][0] for b in boxes]
    heights = [b["y"][1] - b["y"][0] for b in boxes]
    # Upright boxes share one width; sideways ones (vert=False) share one height (up to float
    # noise: 1.15 - 0.85 is not 2.15 - 1.85).
    def same(values):
        return all(math.isclose(v, values[0], rel_tol=1e-6, abs_tol=1e-9) for v in values)

    upright = same(widths) or not same(heights)
    if not upright:
        _swap_axes_labels(chart)
    category_axis = ax.xaxis if upright else ax.yaxis
    for box in boxes:
        span, values = (box["x"], box["y"]) if upright else (box["y"], box["x"])
        box.update(span=span, q1=values[0], q3=values[1], median=None, low=values[0], high=values[1], outliers=[])
    for line in ax.get_lines():
        xs, ys = [_round(v) for v in line.get_xdata()], [_round(v) for v in line.get_ydata()]
        positions, values = (xs, ys) if upright else (ys, xs)
        if not positions:
            continue
        owner = next((b for b in boxes if all(b["span"][0] - 1e-9 <= p <= b["span"][1] + 1e-9 for p in positions)), None)
        if owner is None:
            continue
        if line.get_linestyle() in ("None", "", " ") and line.get_marker() not in (None, "None", "", " "):
            owner["outliers"].extend(values)  # fliers: markers only
            continue
        if len(values) != 2:
            continue
        if values[0] == values[1]:
            # A median spans the box; caps are shorter and lie outside it.
            if owner["q1"] <= values[0] <= owner["q3"] and positions[0] != positions[1]:
                owner["median"] = values[0]
            continue
        low, high = min(values), max(values)
        if high == owner["q1"]:
            owner["low"] = low
        elif low == owner["q3"]:
            owner["high"] = high
    for box in boxes:
        middle = (box["span"][0] + box["span"][1]) / 2
        chart["elements"].append(
            {
                "label": _position_label(category_axis, middle),
                "min": box["low"],
                "first_quartile": box["q1"],
                "median": box["median"],
                "third_quartile": box["q3"],
                "max": box["high"],
                "outliers": box["outliers"],
            }
        )
    return chart


def _axes_chart(ax):
    kind = _kind_of(ax)
    if kind in ("line", "scatter"):
        return _point_chart(ax, kind)
    if kind == "bar":
        return _bar_chart(ax)
    if kind == "pie":
        return _pie_chart(ax)
    if kind == "box_and_whisker":
        return _box_chart(ax)
    return {"type": "unknown", "title": _text_or_none(ax.get_title()), "elements": []}


def figure_chart(figure):
    """E2B's chart JSON for a figure; None for a blank figure or when extraction fails."""
    try:
        axes = figure.get_axes()
        if not axes:
            return None
        if len(axes) == 1:
            return _axes_chart(axes[0])
        getter = getattr(figure, "get_suptitle", None)
        suptitle = getter() if callable(getter) else (figure._suptitle.get_text() if getattr(figure, "_suptitle", None) else "")
        return {"type": "superchart", "title": _text_or_none(suptitle), "elements": [_axes_chart(ax) for ax in axes]}
    except Exception:
        return None


# ---- installation -------------------------------------------------------------------------------


def _json_formatter(mime, parent, type_module, type_name, function):
    """A formatter of `mime` for instances of one class, named so its module loads lazily."""
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    def handles(obj):
        return any(getattr(c, "__module__", None) == type_module and getattr(c, "__name__", None) == type_name for c in type(obj).__mro__)

    class NestboxJsonFormatter(BaseFormatter):
        format_type = Unicode(mime)
        # No object has this method: only `function` produces output.
        print_method = ObjectName("_repr_nestbox_never_")
        _return_type = (dict,)

        # Not a type printer: matplotlib's inline backend drops every formatter's Figure
        # printers when it activates (IPython's select_figure_formats), so the class is matched
        # here, at display time.
        def __call__(self, obj):
            if not self.enabled or not handles(obj):
                return None
            result = function(obj)
            return result if isinstance(result, dict) else None

    return NestboxJsonFormatter(parent=parent)


def _print_in_one_write():
    """print() as a single write. The built-in writes its arguments and `end` separately, and
    ipykernel's stream flushes on a timer, so one print could reach the client as two stream
    messages (the text, then its newline). The text is composed first, then written at once."""
    original = builtins.print
    if getattr(original, "_nestbox_single_write", False):
        return

    def print(*args, sep=" ", end="\n", file=None, flush=False):
        target = sys.stdout if file is None else file
        if target is None:
            return
        text = io.StringIO()
        original(*args, sep=sep, end=end, file=text)
        target.write(text.getvalue())
        if flush:
            target.flush()

    print.__doc__ = original.__doc__
    print._nestbox_single_write = True
    builtins.print = print


def _display_pil_images():
    """A PIL image's show() displays it in the cell (there is no screen to open a viewer on), and
    so does save() to a path, as upstream's kernels do: its PNG becomes a result. Only when Pillow is
    installed (the code-interpreter image); it is imported here, once per kernel."""
    try:
        from PIL import Image
        from IPython.display import display
    except ImportError:
        return
    if getattr(Image.Image.show, "_nestbox_display", False):
        return
    original_save = Image.Image.save

    def show(self, title=None, **options):
        display(self)

    def save(self, fp, format=None, **params):
        result = original_save(self, fp, format, **params)
        # Only a save to a path is the user's: libraries write images into file objects (every
        # matplotlib figure is rendered through Pillow into a buffer), which must not show up.
        if isinstance(fp, (str, os.PathLike)):
            display(self)
        return result

    show._nestbox_display = True
    show.__doc__ = Image.Image.show.__doc__
    save.__doc__ = original_save.__doc__
    Image.Image.show = show
    Image.Image.save = save


def install(shell):
    _print_in_one_write()
    _display_pil_images()
    formatters = shell.display_formatter.formatters
    formatters[CHART_MIME] = _json_formatter(CHART_MIME, shell.display_formatter, "matplotlib.figure", "Figure", figure_chart)
    formatters[DATAFRAME_MIME] = _json_formatter(DATAFRAME_MIME, shell.display_formatter, "pandas.core.frame", "DataFrame", _dataframe_data)


def _install_in_running_kernel():
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        install(shell)


_install_in_running_kernel()

"""Owns a job's rich outputs: MIME bundles for ``display()``, the last expression and open figures.

Loaded by the zygote as the module ``_snakecage_display`` before the runner, which
imports it.  A bundle is a dict of MIME type to text (base64 for ``image/png``),
like the ``data`` of a Jupyter ``display_data`` message.  Every bundle is bounded:
one larger than the job's ``max_bundle_bytes`` is replaced by a note, and a job
keeps at most ``MAX_BUNDLES`` of them.  What would not be kept is not made either:
past the cap, ``display()`` only prints and an open figure is closed undrawn, so a
job that leaves hundreds of figures open costs the drawing of fifty.

Only the standard library is imported at module level; numpy, pandas and
matplotlib are looked up in ``sys.modules`` when a value might be theirs.
"""

import base64
import builtins
import html
import io
import sys
import time
import warnings

from _snakecage_alarm import Alarm, TooSlow

DEFAULT_MAX_BUNDLE_BYTES = 1 << 20
"""Used when a job does not say (``max_bundle_bytes`` 0 or missing)."""

MAX_BUNDLES = 50
"""Bundles kept per job; a note says how many more there were."""

DATAFRAME_MAX_ROWS = 20
DATAFRAME_MAX_COLS = 20
_MARKDOWN_CELL_CHARS = 60

REPORT_MARGIN = (0.1, 0.1, 1.0)
"""``(fraction, least, most)``: the part of a job's time limit, in seconds, kept for
reporting its result (turning the bundles into a frame, sending it, the supervisor
reading it) once the program has ended: the figures it left open are drawn only until
``fraction`` of the limit, at least ``least`` and at most ``most`` seconds, is left."""

# --------------------------------------------------------------------------
# Collecting a job's outputs


class Collector:
    """The bundles of one job, in the order they were produced."""

    def __init__(self, max_bundle_bytes=0, timeout_ms=0):
        self.max_bundle_bytes = max_bundle_bytes or DEFAULT_MAX_BUNDLE_BYTES
        self.bundles = []
        self.dropped = 0
        self.shown_figures = set()
        self.draw_until = _draw_until(timeout_ms)
        self.not_drawn = 0
        """Figures left open that the time limit left undrawn."""

    def full(self):
        return len(self.bundles) >= MAX_BUNDLES

    def add(self, bundle):
        if not bundle:
            return
        if self.full():
            self.dropped += 1
            return
        size = sum(len(key) + len(value) for key, value in bundle.items())
        if size > self.max_bundle_bytes:
            kinds = ", ".join(sorted(bundle))
            bundle = {
                "text/plain": "[output omitted: a %s bundle of %d bytes exceeds the limit of %d bytes]"
                % (kinds, size, self.max_bundle_bytes)
            }
        self.bundles.append(bundle)

    def display(self, obj, echo):
        """Add ``obj``'s bundle; with ``echo``, write its text to stdout too. Past
        ``MAX_BUNDLES`` only its text is made (a figure is not drawn), and counted."""
        if self.full():
            self.dropped += 1
            if echo:
                _echo(plain_text(obj, self))
            return
        bundle = mime_bundle(obj, self)
        if echo and "text/plain" in bundle:
            _echo(bundle["text/plain"])
        self.add(bundle)

    def displayhook(self, value):
        """``sys.displayhook`` during a job: what the REPL prints, plus a bundle."""
        if value is None:
            return
        builtins._ = None  # like sys.__displayhook__, so repr() can't see a stale _
        self.display(value, echo=True)
        builtins._ = value

    def finish(self):
        """Capture the figures left open (then close them all) and return the bundles."""
        try:
            self._capture_open_figures()
        except (KeyboardInterrupt, TooSlow):
            # Interrupted while drawing (a session's deadline), or out of time just as a
            # drawing ended: report what there is.
            _close_all_figures()
        if self.not_drawn:
            note = "[%d %s left open not rendered: too close to the run's time limit]" % (
                self.not_drawn,
                _plural(self.not_drawn, "figure"),
            )
            print("snakecage: rendering the figures left open was cut short: %s" % note, file=sys.stderr)
            self.bundles.append({"text/plain": note})
            self.not_drawn = 0
        if self.dropped:
            note = "[%d more %s omitted: a run keeps at most %d]" % (
                self.dropped,
                _plural(self.dropped, "output"),
                MAX_BUNDLES,
            )
            self.bundles.append({"text/plain": note})
            self.dropped = 0
        return self.bundles

    def _capture_open_figures(self):
        """Draws the figures left open, in order, while there is room for their bundles
        and time before ``draw_until``; counts the others. Each is closed once drawn, so
        its renderer's memory is free for the next."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        try:
            managers = pyplot._pylab_helpers.Gcf.get_all_fig_managers()
        except Exception:
            return
        if not managers:
            return  # most jobs: no timer to set up
        try:
            with Alarm() as alarm:
                while managers:
                    try:
                        figure = managers.pop(0).canvas.figure
                    except Exception:
                        continue
                    if id(figure) in self.shown_figures:
                        continue
                    if self.full():
                        self.dropped += 1
                        continue
                    left = None if self.draw_until is None else self.draw_until - time.monotonic()
                    if left is not None and left <= 0:
                        self.not_drawn += 1
                        continue
                    try:
                        try:
                            if left is not None:
                                alarm.arm(left)
                            bundle = mime_bundle(figure, self)
                        finally:
                            alarm.disarm()
                    except TooSlow:
                        alarm.disarm()  # raised before the disarm above took effect
                        self.not_drawn += 1
                        self.draw_until = time.monotonic()
                        continue
                    self.add(bundle)
                    _close_figure(pyplot, figure)
        finally:
            _close_all_figures()


def _plural(n, noun):
    return noun if n == 1 else noun + "s"


def _draw_until(timeout_ms):
    """When drawing the figures a job left open must stop (``time.monotonic``), so the
    result gets out before the job's time limit; ``None`` without a limit."""
    if not timeout_ms:
        return None
    limit = timeout_ms / 1000
    fraction, least, most = REPORT_MARGIN
    return time.monotonic() + limit - min(max(limit * fraction, least), most)


def _close_figure(pyplot, figure):
    try:
        pyplot.close(figure)
    except Exception:
        pass


def _echo(text):
    """Write ``text`` and a newline to stdout as ``sys.__displayhook__`` does.

    A repr stdout cannot encode (a lone surrogate: ``chr(0xd800)`` in a ``__repr__``)
    is written with ``backslashreplace``, as CPython's displayhook does, instead of
    raising ``UnicodeEncodeError`` from inside the runner.
    """
    stdout = sys.stdout
    try:
        stdout.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stdout, "encoding", None) or "utf-8"
        data = text.encode(encoding, "backslashreplace")
        buffer = getattr(stdout, "buffer", None)
        if buffer is not None:
            stdout.flush()
            buffer.write(data)
        else:
            stdout.write(data.decode(encoding, "strict"))
    stdout.write("\n")


_current = None
"""The running job's Collector, or None between jobs."""


def begin(max_bundle_bytes=0, timeout_ms=0):
    """A new job's Collector; ``timeout_ms`` (0: none) is the job's time limit, counted
    from now."""
    global _current
    _current = Collector(max_bundle_bytes, timeout_ms)
    return _current


def end():
    """The finished job's bundles; later ``display()`` calls only print."""
    global _current
    collector, _current = _current, None
    return collector.finish() if collector is not None else []


def display(*objs, **kwargs):
    """Show each object as rich output (and its text on stdout), like IPython's ``display``."""
    for obj in objs:
        collector = _current
        if collector is None:  # outside a job (a leftover thread): text only
            sys.stdout.write(_safe_repr(obj) + "\n")
        else:
            collector.display(obj, echo=True)


def _close_all_figures():
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        try:
            pyplot.close("all")
        except Exception:
            pass


# --------------------------------------------------------------------------
# MIME bundles


def mime_bundle(obj, collector=None):
    """The MIME bundle of ``obj``: text/plain always, richer types where known."""
    text = plain_text(obj, collector)
    bundle = {"text/plain": text}
    if is_instance(obj, "matplotlib.figure", "Figure"):
        png, failure = _figure_png(obj)
        if png is not None:
            bundle["image/png"] = png
        else:
            # Said where the model and the user look: the bundle, and stderr.
            note = "[figure not rendered: %s]" % failure
            bundle["text/plain"] = text + "\n" + note
            print("snakecage: %s %s" % (text, note), file=sys.stderr)
        return bundle
    if is_instance(obj, "pandas", "DataFrame"):
        bundle.update(_dataframe_rich(obj))
        return bundle
    if is_instance(obj, "numpy", "ndarray"):
        return bundle
    for method, mime in (
        ("_repr_html_", "text/html"),
        ("_repr_markdown_", "text/markdown"),
        ("_repr_svg_", "image/svg+xml"),
        ("_repr_png_", "image/png"),
    ):
        value = _call_repr_method(obj, method)
        if isinstance(value, bytes) and mime == "image/png":
            value = base64.b64encode(value).decode("ascii")
        if isinstance(value, str):
            bundle[mime] = value
    return bundle


def plain_text(obj, collector=None):
    """The ``text/plain`` of ``obj``'s bundle, made alone: a figure is not drawn (but
    counts as shown)."""
    if is_instance(obj, "matplotlib.figure", "Figure"):
        if collector is not None:
            collector.shown_figures.add(id(obj))
        return _safe_repr(obj)
    if is_instance(obj, "pandas", "DataFrame"):
        try:
            text = _dataframe_text(obj)
            if text is not None:
                return text
        except Exception:
            pass
        return _safe_repr(obj)
    if is_instance(obj, "numpy", "ndarray"):
        return ndarray_text(obj)
    return _safe_repr(obj)


def is_instance(obj, module, name):
    mod = sys.modules.get(module)
    cls = getattr(mod, name, None) if mod is not None else None
    return isinstance(cls, type) and isinstance(obj, cls)


def _safe_repr(obj):
    try:
        return repr(obj)
    except Exception as exc:
        return "<repr failed: %s: %s>" % (type(exc).__name__, exc)


def _call_repr_method(obj, name):
    method = getattr(type(obj), name, None)
    if method is None:
        return None
    try:
        return method(obj)
    except Exception:
        return None


_FAILURE_CHARS = 300
"""The most of a rendering failure's message a note quotes."""


def _figure_png(figure):
    """``(png, None)``, or ``(None, why)`` when drawing failed (a figure too large for the
    memory limit raises ``MemoryError``)."""
    try:
        buf = io.BytesIO()
        with warnings.catch_warnings(record=True) as caught:
            figure.savefig(buf, format="png", bbox_inches="tight")
        _show_figure_warnings(caught)
        return base64.b64encode(buf.getvalue()).decode("ascii"), None
    except Exception as exc:
        try:
            why = "%s: %s" % (_type_name_of_class(type(exc)), exc)
        except Exception:
            why = _type_name_of_class(type(exc))
        if len(why) > _FAILURE_CHARS:
            why = why[: _FAILURE_CHARS - 1] + "…"
        return None, why


def _show_figure_warnings(caught):
    """Show what drawing a figure warned about (a glyph missing from the font, say) as
    from the figure: warnings name the line that called matplotlib, and when the runner
    draws a figure left open that line is the runner's, not the job's."""
    for w in caught:
        sys.stderr.write("<figure>: %s: %s\n" % (_type_name_of_class(w.category), w.message))


def _type_name_of_class(cls):
    return type.__dict__["__name__"].__get__(cls)


def ndarray_text(array):
    """``array(shape=(1000, 3), dtype=float64)`` on a first line, then numpy's own repr,
    which summarises a large array with ``...``."""
    return "array(shape=%s, dtype=%s)\n%s" % (tuple(int(n) for n in array.shape), array.dtype, _safe_repr(array))


def dataframe_summary(df, max_listed=10):
    """``1000 rows × 3 columns; dtypes: a int64, b float64, c object`` (counts per dtype
    when there are more than ``max_listed`` columns, and how many columns the table shows
    when it cannot show them all)."""
    rows, cols = df.shape
    dtypes = df.dtypes
    if cols <= max_listed:
        listed = ", ".join("%s %s" % (name, dtype) for name, dtype in dtypes.items())
    else:
        counts = {}
        for dtype in dtypes:
            counts[str(dtype)] = counts.get(str(dtype), 0) + 1
        listed = ", ".join("%s(%d)" % item for item in sorted(counts.items()))
    shown = " (%d shown)" % DATAFRAME_MAX_COLS if cols > DATAFRAME_MAX_COLS else ""
    return "%d rows × %d columns%s; dtypes: %s" % (rows, cols, shown, listed or "none")


def _is_cut(df):
    rows, cols = df.shape
    return rows > DATAFRAME_MAX_ROWS or cols > DATAFRAME_MAX_COLS


def _dataframe_text(df):
    """Past ``DATAFRAME_MAX_ROWS`` rows or ``DATAFRAME_MAX_COLS`` columns: pandas' table of
    the first and last ones, then the summary line."""
    if not _is_cut(df):
        return None
    table = df.to_string(max_rows=DATAFRAME_MAX_ROWS, max_cols=DATAFRAME_MAX_COLS, show_dimensions=False)
    return table + "\n\n" + dataframe_summary(df)


def _dataframe_rich(df):
    """A DataFrame's ``text/html`` and ``text/markdown``. The three views of a DataFrame
    (with ``plain_text``'s) show the same rows and columns and, when cut, end with the same
    summary line (pandas' own shape line is left out: it would be a second)."""
    out = {}
    try:
        out["text/html"] = df.to_html(
            max_rows=DATAFRAME_MAX_ROWS, max_cols=DATAFRAME_MAX_COLS, show_dimensions=False
        )
        if _is_cut(df):
            out["text/html"] += "<p>%s</p>" % html.escape(dataframe_summary(df))
    except Exception:
        pass
    try:
        out["text/markdown"] = dataframe_markdown(df)
    except Exception:
        pass
    return out


def _shown_positions(n, limit):
    """The positions of ``n`` rows (or columns) a table shows, as pandas chooses them: all
    when they fit in ``limit``, else the first and last halves with ``None`` for the gap."""
    if n <= limit:
        return list(range(n))
    head = limit // 2
    return list(range(head)) + [None] + list(range(n - (limit - head), n))


def dataframe_markdown(df, max_rows=DATAFRAME_MAX_ROWS, max_cols=DATAFRAME_MAX_COLS):
    """A GitHub-flavoured markdown table of the rows and columns pandas' text shows (the
    first and last ones, ``...`` between them), with the summary line below it when
    anything was left out."""
    rows, cols = df.shape
    row_positions = _shown_positions(rows, max_rows)
    col_positions = _shown_positions(cols, max_cols)

    def cells(value_at):
        return ["..." if c is None else _md_cell(value_at(c)) for c in col_positions]

    header = [_md_cell(_index_title(df))] + cells(lambda c: df.columns[c])
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    for r in row_positions:
        if r is None:
            row = ["..."] * len(header)
        else:
            row = [_md_cell(df.index[r])] + cells(lambda c, r=r: df.iat[r, c])
        lines.append("| " + " | ".join(row) + " |")
    if rows > max_rows or cols > max_cols:
        lines.append("")
        lines.append("*%s*" % _md_cell_text(dataframe_summary(df)))
    return "\n".join(lines) + "\n"


def _index_title(df):
    name = df.index.name
    return "" if name is None else name


def _md_cell_text(text):
    return text.replace("\\", "\\\\").replace("*", "\\*")


def _md_cell(value):
    text = str(value).replace("\\", "\\\\").replace("|", "\\|")
    text = " ".join(text.split())
    if len(text) > _MARKDOWN_CELL_CHARS:
        text = text[: _MARKDOWN_CELL_CHARS - 1] + "…"
    return text

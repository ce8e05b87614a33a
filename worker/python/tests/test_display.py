"""Tests for worker/python/display.py through the runner: the rich ``results`` of a job."""

import base64
import signal
import sys

import pytest

from runner_modules import OK, job

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def pyplot():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def png(bundle):
    data = base64.b64decode(bundle["image/png"])
    assert data.startswith(PNG_MAGIC)
    return data


def test_a_plain_value_gives_one_text_bundle(runner, capsys):
    result = runner.run(job("x = 6\nx * 7", interactive=True))
    assert result == dict(OK, results=[{"text/plain": "42"}])
    assert capsys.readouterr().out == "42\n"


def test_a_dataframe_as_last_line_gives_markdown_and_html(runner, capsys):
    pytest.importorskip("pandas")
    code = "import pandas as pd\npd.DataFrame({'name': ['a', 'b|c'], 'n': [1, 2]})"
    (bundle,) = runner.run(job(code, interactive=True))["results"]
    assert set(bundle) == {"text/plain", "text/html", "text/markdown"}
    assert "<table" in bundle["text/html"]
    assert bundle["text/markdown"] == "|  | name | n |\n|---|---|---|\n| 0 | a | 1 |\n| 1 | b\\|c | 2 |\n"
    assert "name" in capsys.readouterr().out  # the text still reaches stdout


def test_a_long_dataframe_is_its_first_and_last_rows_and_one_summary_line_in_every_view(runner, capsys):
    pd = pytest.importorskip("pandas")
    text_dtype = pd.Series(["x"]).dtype  # object before pandas 3, str since
    summary = "1000 rows × 2 columns; dtypes: v int64, name %s" % text_dtype
    code = "import pandas as pd\npd.DataFrame({'v': range(1000), 'name': ['n'] * 1000})"
    (bundle,) = runner.run(job(code, interactive=True))["results"]
    markdown = bundle["text/markdown"]
    rows = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 10 + 1 + 10  # header, first ten, the gap, last ten
    assert rows[1] == "| 0 | 0 | n |" and rows[11] == "| ... | ... | ... |" and rows[-1] == "| 999 | 999 | n |"
    assert markdown.endswith("\n\n*%s*\n" % summary)
    assert markdown.count("rows ×") == 1
    page = bundle["text/html"]
    assert "<th>999</th>" in page and page.endswith("<p>%s</p>" % summary)
    assert page.count("rows ×") == 1
    assert page.count("<tr>") < 30
    assert bundle["text/plain"].endswith("\n\n" + summary) and bundle["text/plain"].count("rows ×") == 1
    capsys.readouterr()


def test_a_wide_dataframe_shows_its_first_and_last_columns_and_says_how_many(runner, capsys):
    pytest.importorskip("pandas")
    code = "import pandas as pd\npd.DataFrame({'c%d' % i: [i] * 3 for i in range(30)})"
    (bundle,) = runner.run(job(code, interactive=True))["results"]
    summary = "3 rows × 30 columns (20 shown); dtypes: int64(30)"
    header = bundle["text/markdown"].splitlines()[0]
    assert header.startswith("|  | c0 | c1 |") and "| c9 | ... | c20 |" in header and header.endswith("| c29 |")
    for view, ending in [("text/plain", summary), ("text/markdown", "*%s*\n" % summary), ("text/html", "<p>%s</p>" % summary)]:
        assert bundle[view].endswith(ending), view
        assert bundle[view].count("rows ×") == 1, view
    capsys.readouterr()


def test_an_open_figure_is_captured_without_savefig_and_closed(runner, pyplot, capsys):
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nprint('drawn')"
    result = runner.run(job(code, interactive=True))
    assert result["exit_code"] == 0
    (bundle,) = result["results"]
    png(bundle)
    assert bundle["text/plain"].startswith("<Figure size")
    assert pyplot.get_fignums() == []
    assert capsys.readouterr().out == "drawn\n"


def test_what_drawing_an_open_figure_warns_about_is_shown_as_from_the_figure(runner, pyplot, capsys):
    # U+3042 is not in matplotlib's default font: drawing warns. The runner draws the
    # figure after the job, so the warning named the runner's line in display.py.
    code = "import matplotlib.pyplot as plt\nplt.title('\u3042 titre')\nplt.plot([1, 2]);"
    result = runner.run(job(code, interactive=True))
    assert result["exit_code"] == 0, result
    (bundle,) = result["results"]
    png(bundle)
    err = capsys.readouterr().err
    assert "<figure>: UserWarning: Glyph 12354" in err, err
    assert "display.py" not in err, err


def test_a_repr_with_a_lone_surrogate_is_echoed_backslash_escaped_like_cpython(runner, capsys):
    code = "class A:\n    def __repr__(self):\n        return 'x' + chr(0xD800)\nA()"
    result = runner.run(job(code, interactive=True))
    assert result["exit_code"] == 0, result
    assert result["results"] == [{"text/plain": "x\ud800"}]
    assert capsys.readouterr().out == "x\\ud800\n"


def test_display_twice_gives_two_bundles_in_order(runner, capsys):
    result = runner.run(job("display('first')\ndisplay({'second': 2})\nNone", interactive=True))
    assert result["results"] == [{"text/plain": "'first'"}, {"text/plain": "{'second': 2}"}]
    assert capsys.readouterr().out == "'first'\n{'second': 2}\n"


def test_a_displayed_figure_is_not_shown_twice(runner, pyplot, capsys):
    code = "import matplotlib.pyplot as plt\nfig = plt.figure()\nfig.gca().plot([1, 2])\ndisplay(fig)\n'done'"
    results = runner.run(job(code, interactive=True))["results"]
    assert [sorted(b) for b in results] == [["image/png", "text/plain"], ["text/plain"]]
    assert results[1] == {"text/plain": "'done'"}


def test_a_figure_that_cannot_be_drawn_says_why_in_its_bundle_and_on_stderr(runner, pyplot, capsys):
    # As a figure too large for the memory limit fails inside savefig.
    code = (
        "import matplotlib.pyplot as plt\n"
        "fig = plt.figure(figsize=(20, 20))\n"
        "def too_big(*args, **kwargs):\n"
        "    raise MemoryError('Unable to allocate 72.4 MiB for an array')\n"
        "fig.savefig = too_big\n"
        "fig"
    )
    result = runner.run(job(code, interactive=True))
    assert result["exit_code"] == 0, result
    note = "[figure not rendered: MemoryError: Unable to allocate 72.4 MiB for an array]"
    assert result["results"] == [{"text/plain": "<Figure size 2000x2000 with 0 Axes>\n" + note}]
    captured = capsys.readouterr()
    assert captured.err == "snakecage: <Figure size 2000x2000 with 0 Axes> " + note + "\n"
    assert captured.out == "<Figure size 2000x2000 with 0 Axes>\n" + note + "\n"


def test_objects_with_ipython_repr_methods_are_rich(runner, capsys):
    code = (
        "class Card:\n"
        "    def _repr_html_(self):\n        return '<b>card</b>'\n"
        "    def _repr_markdown_(self):\n        return '**card**'\n"
        "    def __repr__(self):\n        return 'Card()'\n"
        "Card()"
    )
    (bundle,) = runner.run(job(code, interactive=True))["results"]
    assert bundle == {"text/plain": "Card()", "text/html": "<b>card</b>", "text/markdown": "**card**"}


def test_an_oversized_bundle_is_replaced_by_a_note(runner, capsys):
    code = "display('x' * 5000)\n'small'"
    result = runner.run(dict(job(code, interactive=True), max_bundle_bytes=1000))
    big, small = result["results"]
    assert list(big) == ["text/plain"]
    assert big["text/plain"].startswith("[output omitted: a text/plain bundle of ")
    assert "exceeds the limit of 1000 bytes" in big["text/plain"]
    assert small == {"text/plain": "'small'"}


def test_bundles_per_job_are_bounded(runner, capsys):
    results = runner.run(job("for i in range(80):\n    display(i)"))["results"]
    assert len(results) == 51
    assert results[-1] == {"text/plain": "[30 more outputs omitted: a run keeps at most 50]"}
    # Past the cap the values are still printed, as display() always does.
    assert capsys.readouterr().out == "".join("%d\n" % i for i in range(80))


# Each figure's savefig is its own (an instance attribute, as in the test above): it
# records that the figure was drawn and writes a PNG signature, without drawing.
COUNTED_FIGURES = """\
import matplotlib.pyplot as plt
drawn = []
def counted(fig):
    def savefig(buf, **kwargs):
        drawn.append(fig.number)
        buf.write(b"\\x89PNG\\r\\n\\x1a\\n")
    fig.savefig = savefig
    return fig
"""


def test_figures_left_open_past_the_cap_are_closed_without_being_drawn(runner, pyplot, capsys):
    code = COUNTED_FIGURES + "for i in range(70):\n    counted(plt.figure())\n"
    session = runner.Session()
    result = session.run(job(code))
    assert result["exit_code"] == 0, result
    # The first fifty were drawn, each once; the other twenty never.
    drawn = session.run(job("drawn", interactive=True))["results"][0]["text/plain"]
    assert drawn == repr(list(range(1, 51)))
    results = result["results"]
    assert len(results) == 51, results[-1]
    assert all(sorted(b) == ["image/png", "text/plain"] for b in results[:50])
    assert results[50] == {"text/plain": "[20 more outputs omitted: a run keeps at most 50]"}
    assert pyplot.get_fignums() == []


def test_figures_displayed_past_the_cap_are_printed_not_drawn(runner, pyplot, capsys):
    code = COUNTED_FIGURES + "for i in range(60):\n    display(counted(plt.figure()))\n"
    session = runner.Session()
    result = session.run(job(code))
    assert result["exit_code"] == 0, result
    drawn = session.run(job("drawn", interactive=True))["results"][0]["text/plain"]
    assert drawn == repr(list(range(1, 51)))
    results = result["results"]
    assert len(results) == 51
    assert results[50] == {"text/plain": "[10 more outputs omitted: a run keeps at most 50]"}
    # Every one is echoed as display() echoes a figure, and none is captured again at the end.
    out = capsys.readouterr().out
    assert out.count("<Figure size 640x480 with 0 Axes>\n") == 60, out
    assert pyplot.get_fignums() == []


def test_figures_left_open_are_drawn_only_while_the_time_limit_allows(runner, pyplot, capsys):
    # The first figure draws at once; the next four would take a minute each. The job's
    # limit (3 s) leaves them undrawn: the one being drawn is interrupted, the rest skipped.
    code = (
        COUNTED_FIGURES
        + "import time\n"
        + "counted(plt.figure())\n"
        + "for i in range(4):\n"
        + "    plt.figure().savefig = lambda buf, **kwargs: time.sleep(60)\n"
    )
    result = runner.run(dict(job(code), timeout_ms=3000))
    assert result["exit_code"] == 0, result
    *images, note = result["results"]
    # On a stalled machine even the first may be out of time; the four never draw.
    assert len(images) <= 1 and all("image/png" in b for b in images), result
    undrawn = 5 - len(images)
    expected = "[%d figures left open not rendered: too close to the run's time limit]" % undrawn
    assert note == {"text/plain": expected}
    err = capsys.readouterr().err
    assert "snakecage: rendering the figures left open was cut short: " + expected in err, err
    assert pyplot.get_fignums() == []
    # The job's alarm is gone with it.
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL


def test_a_failing_job_still_reports_what_it_displayed(runner, capsys):
    result = runner.run(job("display(1)\n1 / 0"))
    assert result["exit_code"] == 1
    assert result["results"] == [{"text/plain": "1"}]


def test_display_outside_a_job_only_prints(runner, capsys):
    display = sys.modules["_snakecage_display"]
    display.display("late")
    assert capsys.readouterr().out == "'late'\n"
    assert display.end() == []


def test_an_array_shows_its_shape_and_dtype_then_numpys_summary(runner, capsys):
    pytest.importorskip("numpy")
    (bundle,) = runner.run(job("import numpy as np\nnp.zeros((1000, 3))", interactive=True))["results"]
    text = bundle["text/plain"]
    first, rest = text.split("\n", 1)
    assert first == "array(shape=(1000, 3), dtype=float64)"
    assert rest.startswith("array([[0., 0., 0.],")
    assert "..." in rest and len(text.splitlines()) < 12  # numpy's own summary, not 1000 rows
    assert capsys.readouterr().out == text + "\n"
    (bundle,) = runner.run(job("import numpy as np\nnp.arange(3, dtype=np.int32)", interactive=True))["results"]
    assert bundle == {"text/plain": "array(shape=(3,), dtype=int32)\narray([0, 1, 2], dtype=int32)"}
    (bundle,) = runner.run(job("import numpy as np\nnp.array(2.5)", interactive=True))["results"]
    assert bundle["text/plain"] == "array(shape=(), dtype=float64)\narray(2.5)"


def test_a_dataframe_over_twenty_rows_is_a_cut_table_and_a_summary_line(runner, capsys):
    pd = pytest.importorskip("pandas")
    text_dtype = pd.Series(["x"]).dtype  # object before pandas 3, str since
    summary = "1000 rows × 3 columns; dtypes: v int64, ñame %s, f float64" % text_dtype
    code = "import pandas as pd\npd.DataFrame({'v': range(1000), 'ñame': ['x'] * 1000, 'f': [0.5] * 1000})"
    (bundle,) = runner.run(job(code, interactive=True))["results"]
    lines = bundle["text/plain"].splitlines()
    assert lines[-1] == summary
    assert len(lines) < 26 and any(line.strip().startswith("..") for line in lines)
    assert "999" in bundle["text/plain"]  # the last rows are shown too
    assert bundle["text/markdown"].rstrip().endswith("*%s*" % summary)
    assert bundle["text/html"].endswith("<p>%s</p>" % summary)
    capsys.readouterr()
    # Many columns: dtypes are counted.
    code = "import pandas as pd\npd.DataFrame({'c%d' % i: [1.0] * 25 for i in range(30)})"
    (bundle,) = runner.run(job(code, interactive=True))["results"]
    assert bundle["text/plain"].splitlines()[-1] == "25 rows × 30 columns (20 shown); dtypes: float64(30)"
    # Twenty rows or fewer: pandas' own text, no summary.
    (bundle,) = runner.run(job("import pandas as pd\npd.DataFrame({'v': range(20)})", interactive=True))["results"]
    assert "dtypes" not in bundle["text/plain"] and len(bundle["text/plain"].splitlines()) == 21

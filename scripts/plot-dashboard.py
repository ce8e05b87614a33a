"""Draws the Grafana dashboard's panels from the series the dashboard test exported.

The integration test `dashboard::every_dashboard_panel_and_every_rule_works_against_a_real_prometheus`
writes every panel's range-query results to the file named by DASHBOARD_SERIES; this lays
them out on the dashboard's own 24-column grid (rows, stats, time series, tables) and
saves a PNG, since no Grafana renderer is available:

    DASHBOARD_SERIES=/tmp/series.json cargo test -p snakecage --test integration -- dashboard::every
    .venv/bin/python scripts/plot-dashboard.py /tmp/series.json deploy/dashboard.png
"""

from __future__ import annotations

import json
import math
import re
import sys
from datetime import datetime, timezone

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BACKGROUND = "#111217"
PANEL = "#181b1f"
TEXT = "#ccccdc"
MUTED = "#8e8e9e"
COLORS = ["#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#fade2a"]
ROW_HEIGHT_INCHES = 0.36
WIDTH_INCHES = 22.0


def legend(fmt: str, labels: dict[str, str], expr: str) -> str:
    """Grafana's legendFormat: `{{label}}` replaced by the series' label."""
    if not fmt:
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or expr[:40]
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def human(value: float, unit: str | None) -> str:
    """A value the way a stat panel shows it."""
    if value is None or math.isnan(value):
        return "No data"
    if unit == "percentunit":
        return f"{value * 100:.2f}%"
    if unit == "bytes":
        for suffix in ["B", "KiB", "MiB", "GiB", "TiB"]:
            if abs(value) < 1024 or suffix == "TiB":
                return f"{value:.1f} {suffix}"
            value /= 1024
    if unit == "s":
        return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "reqps":
        return f"{value:.2f} req/s"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.3g}"


def num(v) -> float:
    """A sample value; NaN arrives as null (JSON has no NaN)."""
    return float("nan") if v is None else float(v)


def last_value(panel: dict) -> float:
    for target in panel["targets"]:
        for series in target["series"]:
            values = [num(v) for _, v in series["samples"] if not math.isnan(num(v))]
            if values:
                return values[-1]
    return float("nan")


def draw_timeseries(ax, panel: dict, start: float) -> None:
    color = 0
    for target in panel["targets"]:
        for series in target["series"]:
            xs = [float(t) - start for t, _ in series["samples"]]
            ys = [num(v) for _, v in series["samples"]]
            ax.plot(xs, ys, lw=1.4, color=COLORS[color % len(COLORS)],
                    label=legend(target["legend"], series["labels"], target["expr"]))
            color += 1
    if color == 0:
        ax.text(0.5, 0.5, "No data", color=MUTED, ha="center", va="center", transform=ax.transAxes)
    ax.tick_params(colors=MUTED, labelsize=7)
    ax.grid(color="#2c3235", lw=0.5)
    ax.set_xlabel("seconds into the test", color=MUTED, fontsize=7)
    if panel.get("unit") == "percentunit":
        ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    if 0 < color <= 10:
        ax.legend(fontsize=6, loc="upper left", facecolor=PANEL, edgecolor=PANEL, labelcolor=TEXT)
    for spine in ax.spines.values():
        spine.set_color("#2c3235")


def draw_stat(ax, panel: dict) -> None:
    targets = panel["targets"]
    multi = [s for t in targets for s in t["series"]]
    if len(multi) > 1:
        # One value per series (e.g. a sandbox layer each): name and value, stacked.
        lines = []
        for target in targets:
            for series in target["series"]:
                values = [num(v) for _, v in series["samples"]]
                name = legend(target["legend"], series["labels"], target["expr"])
                lines.append(f"{name}: {human(values[-1] if values else float('nan'), panel.get('unit'))}")
        ax.text(0.03, 0.9, "\n".join(lines), color=TEXT, fontsize=7, va="top", family="monospace",
                transform=ax.transAxes)
        return
    value = last_value(panel)
    ax.text(0.5, 0.45, human(value, panel.get("unit")), color="#73bf69" if not math.isnan(value) else MUTED,
            fontsize=17, ha="center", va="center", weight="bold", transform=ax.transAxes)


def draw_table(ax, panel: dict) -> None:
    lines = []
    for target in panel["targets"]:
        for series in target["series"]:
            labels = {k: v for k, v in series["labels"].items() if k != "__name__"}
            lines.append("  ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    ax.text(0.02, 0.9, "\n".join(lines[:8]) or "No data", color=TEXT, fontsize=6.5, va="top",
            family="monospace", transform=ax.transAxes, wrap=True)


def main(series_path: str, png_path: str) -> None:
    with open(series_path, encoding="utf-8") as f:
        data = json.load(f)
    panels = data["panels"]
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    height = bottom * ROW_HEIGHT_INCHES + 0.8
    fig = plt.figure(figsize=(WIDTH_INCHES, height), facecolor=BACKGROUND)
    when = datetime.fromtimestamp(data["end"], tz=timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    fig.text(0.01, 1 - 0.35 / height, f"{data['title']} — every panel, from the dashboard test's Prometheus ({when})",
             color=TEXT, fontsize=13, weight="bold", va="center")
    top = 0.8 / height
    for panel in panels:
        g = panel["gridPos"]
        left = g["x"] / 24 + 0.004
        width = g["w"] / 24 - 0.008
        y0 = top + g["y"] * ROW_HEIGHT_INCHES / height
        h = g["h"] * ROW_HEIGHT_INCHES / height
        if panel["type"] == "row":
            fig.text(left, 1 - y0 - h / 2, panel["title"], color=TEXT, fontsize=11, weight="bold", va="center")
            continue
        # Leave room inside the panel for its title (and the time series' axes).
        pad_top = 0.3 / height
        pad_bottom = (0.45 / height) if panel["type"] == "timeseries" else 0.05 / height
        pad_left = 0.03 if panel["type"] == "timeseries" else 0.0
        backdrop = fig.add_axes((left, 1 - y0 - h + 0.004 / height * 24, width, h - 0.1 / height))
        backdrop.set_facecolor(PANEL)
        backdrop.set_xticks([])
        backdrop.set_yticks([])
        for spine in backdrop.spines.values():
            spine.set_color("#2c3235")
        backdrop.text(0.01, 0.985, panel["title"], color=TEXT, fontsize=8.5, weight="bold", va="top",
                      transform=backdrop.transAxes)
        ax = fig.add_axes((left + pad_left, 1 - y0 - h + pad_bottom, width - pad_left - 0.006, h - pad_top - pad_bottom))
        ax.set_facecolor(PANEL)
        if panel["type"] == "timeseries":
            draw_timeseries(ax, panel, data["start"])
        else:
            ax.axis("off")
            (draw_stat if panel["type"] == "stat" else draw_table)(ax, panel)
    fig.savefig(png_path, dpi=72, facecolor=BACKGROUND)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])

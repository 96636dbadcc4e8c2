"""speedup_report: one self-contained HTML page comparing profiled training runs.

Inline CSS and SVG, no script, no external reference (a Content-Security-Policy
forbids loading anything): it opens offline and can be committed.

Each comparison's first run is its baseline. Per run: median epoch time
(epochs after the first, minus reported compile time), speedup, warm-up
overhead, the epoch from which cumulative wall time falls below the
baseline's (projected when not reached), and memory.

Input handling:
- fewer than 2 runs, or an item that is not a run: ValueError/TypeError;
- a run lacking a REQUIRED column, or with non-numeric values or missing
  epoch times: ValueError naming the run and the columns;
- a run with no rows: "no epochs recorded" (an empty baseline: no speedups);
- runs with different numbers of epochs: shown in full, cumulative
  comparisons over the epochs all have, with a note.
"""
import html
import importlib.metadata
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

from .profiler import COLUMNS

REQUIRED = ("epoch", "epoch_seconds", "compile_seconds", "peak_rss_mib")
# Epochs a run needs before the epoch it pays off at is projected past them.
PROJECT_FROM = 3
COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       max-width: 1060px; margin: 2em auto; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: .2em; } h2 { margin-top: 2em; border-bottom: 2px solid #ddd; }
.machine, .legend-note, .note { color: #555; font-size: .9em; }
.note { background: #fff6e0; border-left: 4px solid #e0a800; padding: .4em .8em; }
.headline { font-size: 1.1em; }
table { border-collapse: collapse; margin: .6em 0; font-size: .88em; }
th, td { padding: .3em .6em; border-bottom: 1px solid #e4e4e4; text-align: right; }
th { background: #f3f4f6; } td:first-child, th:first-child { text-align: left; }
tr:nth-child(even) td { background: #fafafa; }
.charts { display: flex; flex-wrap: wrap; gap: 1em; }
svg.chart { width: 500px; max-width: 100%; height: auto; background: #fff;
            border: 1px solid #e4e4e4; border-radius: 4px; }
svg text { font: 12px system-ui, sans-serif; fill: #333; }
pre { background: #f6f8fa; padding: .8em; overflow-x: auto; font-size: .85em; }
.wide { overflow-x: auto; }
table.epochs { font-size: .78em; }
table.epochs th { white-space: normal; overflow-wrap: anywhere; min-width: 3.5em; }
table.epochs td { padding: .25em .4em; }
table.clusters th, table.clusters td { text-align: left; }
td.ops { font-family: ui-monospace, monospace; font-size: .9em; max-width: 40em; }
"""


@dataclass
class _Run:
    name: str
    frame: pd.DataFrame

    @property
    def epochs(self):
        return len(self.frame)

    @property
    def cumulative(self):
        return self.frame["epoch_seconds"].cumsum().to_numpy()

    @property
    def steady(self):
        """Median epoch time without compiling, epochs after the first when there are any."""
        f = self.frame if self.epochs == 1 else self.frame.iloc[1:]
        return float((f["epoch_seconds"] - f["compile_seconds"]).median())


def _as_run(item, position):
    if hasattr(item, "dataframe"):                      # a JitProfiler
        name, frame = item.name, item.dataframe
    elif isinstance(item, tuple) and len(item) == 2:
        name, frame = item
    elif isinstance(item, pd.DataFrame):
        name, frame = item.attrs.get("name"), item
    else:
        raise TypeError(f"run {position + 1}: expected a JitProfiler, a (name, DataFrame) pair or "
                        f"a DataFrame, got {type(item).__name__}")
    name = str(name or f"run {position + 1}")
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"run {name!r}: expected a DataFrame, got {type(frame).__name__}")
    if frame.empty:
        return _Run(name, pd.DataFrame(columns=list(REQUIRED)))
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise ValueError(f"run {name!r} lacks column(s) {', '.join(missing)} (has: "
                         f"{', '.join(map(str, frame.columns))}); pass JitProfiler.dataframe")
    frame = frame.reset_index(drop=True).copy()       # (attrs kept: the pid)
    for column in REQUIRED:
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = values.isna() & frame[column].notna()
        if bad.any():
            raise ValueError(f"run {name!r}: column {column} has non-numeric values "
                             f"{frame[column][bad].head(3).tolist()}")
        frame[column] = values
    if frame["epoch_seconds"].isna().any():
        raise ValueError(f"run {name!r}: column epoch_seconds has missing values")
    frame["compile_seconds"] = frame["compile_seconds"].fillna(0.0)
    return _Run(name, frame)


def _comparisons(runs):
    """[(title, [_Run])]: a list of runs is one comparison; a mapping is title -> list."""
    groups = runs.items() if isinstance(runs, dict) else [(None, runs)]
    result = []
    for title, items in groups:
        items = list(items)
        if len(items) < 2:
            raise ValueError(f"speedup_report needs at least 2 runs per comparison (the first is "
                             f"the baseline); {title or 'runs'} has {len(items)}")
        parsed = [_as_run(item, i) for i, item in enumerate(items)]
        seen = {}
        for run in parsed:                               # same model name twice: keep both apart
            seen[run.name] = seen.get(run.name, 0) + 1
            if seen[run.name] > 1:
                run.name = f"{run.name} ({seen[run.name]})"
        result.append((title, parsed))
    return result


def _fmt(value, digits=3):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"
    return str(value)


def _speed_words(ratio):
    if ratio >= 1:
        return f"{ratio:.2f}× faster"
    return f"{1 / ratio:.2f}× slower"


def _payoff(run, base):
    """The first epoch (1-based) where run's cumulative wall time is below the baseline's."""
    n = min(run.epochs, base.epochs)
    below = np.nonzero(run.cumulative[:n] < base.cumulative[:n])[0]
    if below.size:
        return f"epoch {below[0] + 1}"
    if n < PROJECT_FROM:
        return f"not within {n} epoch(s) (too few to project)"
    if run.steady < base.steady:
        gap = run.cumulative[n - 1] - base.cumulative[n - 1]
        return f"~epoch {n + math.floor(gap / (base.steady - run.steady)) + 1} (projected)"
    return "never (slower per epoch)"


def _column_max(run, column):
    return float(run.frame[column].max()) if column in run.frame and run.epochs else math.nan


def _race_verdict(explained):
    """What TensorFlow took over from a run's compiled step, from its explanation."""
    taken = [c for c in getattr(explained, "clusters", ()) if c.kind != "compiled"
             and "faster" in (c.reason or "")]
    if not taken:
        return ""
    ops = sum(len(c.ops) for c in taken)
    return (f" TensorFlow runs {len(taken)} of its parts ({ops} ops): it ran them faster "
            f"here ({html.escape(taken[0].reason)}).")


def _summary(runs, explanations):
    base = runs[0]
    usable = base.epochs > 0
    head = ("run", "epochs", "median epoch (s)", "vs baseline", "warm-up overhead (s)",
            "compile reported (s)", "pays off at", "peak RSS (MiB)",
            "RSS growth since epoch 1 (MiB)",
            "compiled buffers (MiB)", "GPU (MiB)")
    rows, lines = [], []
    for i, run in enumerate(runs):
        if not run.epochs:
            rows.append([run.name, "0", "no epochs recorded"] + ["–"] * (len(head) - 3))
            continue
        first = run.frame["epoch_seconds"].iloc[0]
        ratio = base.steady / run.steady if usable and run.steady > 0 else math.nan
        if i == 0:
            versus, payoff = "baseline", "–"
        elif math.isfinite(ratio):
            versus, payoff = _speed_words(ratio), _payoff(run, base)
            catch_up = ("never falls below the baseline's (slower per epoch)"
                        if payoff.startswith("never") else
                        f"falls below the baseline's at {payoff}")
            lines.append(f"<b>{html.escape(run.name)}</b>: {run.steady:.3g} s per epoch against "
                         f"{base.steady:.3g} s for <b>{html.escape(base.name)}</b>, "
                         f"<b>{_speed_words(ratio)}</b>; its cumulative wall time including "
                         f"compiling {catch_up}." + _race_verdict(explanations.get(run.name)))
        else:
            versus = payoff = "–"
        growth = run.frame["peak_rss_mib"].iloc[-1] - run.frame["peak_rss_mib"].iloc[0]
        rows.append([run.name, str(run.epochs), _fmt(run.steady), versus,
                     _fmt(first - run.steady), _fmt(float(run.frame["compile_seconds"].sum())),
                     payoff, _fmt(_column_max(run, "peak_rss_mib"), 5),
                     f"{growth:+.1f}", _fmt(_column_max(run, "buffer_mib")),
                     _fmt(_column_max(run, "gpu_mib"))])
    table = "<div class='wide'><table class='summary'><tr>{}</tr>{}</table></div>".format(
        "".join(f"<th>{h}</th>" for h in head),
        "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows))
    return "".join(f"<p class='headline'>{line}</p>" for line in lines) + table


def _ticks(high, count=5):
    high = high if high > 0 else 1.0
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(math.ceil(high / step - 1e-9) + 1)]


def _line_chart(title, series):
    """An SVG line chart of [(name, color, values per epoch)], epochs 1.. on x, y from 0."""
    width, height, left, right, top, bottom = 500, 290, 58, 14, 56, 40
    values = [v for _, _, ys in series for v in ys if math.isfinite(v)]
    if not values:
        return f"<p class='note'>{html.escape(title)}: nothing measured.</p>"
    ticks = _ticks(max(values))
    epochs = max(len(ys) for _, _, ys in series)
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(i):
        return left + (plot_w / 2 if epochs == 1 else i * plot_w / (epochs - 1))

    def y(v):
        return top + plot_h * (1 - v / ticks[-1])

    out = [f"<svg class='chart' viewBox='0 0 {width} {height}' role='img' "
           f"xmlns='http://www.w3.org/2000/svg'><title>{html.escape(title)}</title>",
           f"<text x='{left}' y='18' style='font-weight:600;font-size:14px'>"
           f"{html.escape(title)}</text>"]
    for t in ticks:
        out.append(f"<line x1='{left}' x2='{width - right}' y1='{y(t):.1f}' y2='{y(t):.1f}' "
                   f"stroke='#e6e6e6'/><text x='{left - 6}' y='{y(t) + 4:.1f}' "
                   f"text-anchor='end'>{t:g}</text>")
    label_every = math.ceil(epochs / 12)
    for i in range(0, epochs, label_every):
        out.append(f"<text x='{x(i):.1f}' y='{top + plot_h + 16}' "
                   f"text-anchor='middle'>{i + 1}</text>")
    out.append(f"<text x='{left + plot_w / 2}' y='{height - 6}' text-anchor='middle'>epoch</text>")
    legend_x = left
    for name, color, ys in series:
        out.append(f"<rect x='{legend_x}' y='30' width='12' height='12' fill='{color}'/>"
                   f"<text x='{legend_x + 16}' y='40'>{html.escape(name)}</text>")
        legend_x += 30 + 7 * len(name)
        points = [(x(i), y(v), v, i) for i, v in enumerate(ys) if math.isfinite(v)]
        out.append(f"<polyline class='series' fill='none' stroke='{color}' stroke-width='2' "
                   f"points='{' '.join(f'{px:.1f},{py:.1f}' for px, py, _, _ in points)}'/>")
        out.extend(f"<circle cx='{px:.1f}' cy='{py:.1f}' r='3.5' fill='{color}'><title>"
                   f"{html.escape(name)}, epoch {i + 1}: {_fmt(v, 4)}</title></circle>"
                   for px, py, v, i in points)
    out.append("</svg>")
    return "".join(out)


def _charts(runs):
    shown = [(run, COLORS[i % len(COLORS)]) for i, run in enumerate(runs) if run.epochs]
    charts = [
        ("Epoch wall time, s (incl. compiling)", lambda r: r.frame["epoch_seconds"].tolist()),
        ("Cumulative wall time, s (incl. compiling)", lambda r: r.cumulative.tolist()),
    ]
    processes = {r.frame.attrs.get("pid") for r, _ in shown}
    shared = len(shown) > 1 and len(processes) == 1 and None not in processes
    if not shared:
        charts.append(("Peak RSS, MiB", lambda r: r.frame["peak_rss_mib"].tolist()))
    note = ("<p class='note'>These runs shared one process, so their peak RSS is the "
            "process's, theirs together: no chart sets them apart (the tables give it per "
            "epoch).</p>" if shared else "")
    return "<div class='charts'>{}</div>{}".format("".join(
        _line_chart(title, [(run.name, color, values(run)) for run, color in shown])
        for title, values in charts), note)


def _epoch_table(run):
    if not run.epochs:
        return f"<h3>{html.escape(run.name)}</h3><p class='note'>No epochs recorded.</p>"
    frame = run.frame.assign(epoch=run.frame["epoch"] + 1)      # from 1, as the charts count
    table = frame.to_html(index=False, na_rep="–", border=0, classes="epochs",
                          float_format=lambda v: _fmt(v, 4))
    return f"<h3>{html.escape(run.name)}</h3><div class='wide'>{table}</div>"


def _column_legend(runs):
    present = {c for run in runs for c in run.frame.columns}
    legend = dict(COLUMNS, epoch="the epoch, counted from 1 as Keras's progress bar counts")
    items = "".join(f"<li><code>{c}</code>: {html.escape(text)}</li>"
                    for c, text in legend.items() if c in present)
    return (f"<h3>Columns</h3><ul class='legend-note'>{items}<li>other columns: Keras's own "
            "logs (loss, metrics) at the end of the epoch</li></ul>")


def _differing_epochs_note(runs):
    counts = {run.name: run.epochs for run in runs}
    if len(set(counts.values())) <= 1:
        return ""
    listed = ", ".join(f"{html.escape(n)}: {c}" for n, c in counts.items())
    return (f"<p class='note'>The runs recorded different numbers of epochs ({listed}), e.g. one "
            "stopped early. Each run's median uses its own epochs; cumulative comparisons use "
            f"the first {min(counts.values())}.</p>")


def _explanation(name, explained):
    title = f"<h3>{html.escape(name)}</h3>"
    clusters = getattr(explained, "clusters", None)
    if clusters is None:
        return f"{title}<pre>{html.escape(str(explained))}</pre>"
    compiled = sum(len(c.ops) for c in clusters if c.kind == "compiled")
    total = sum(len(c.ops) for c in clusters)
    rows = "".join(
        f"<tr><td>{i}</td><td>{html.escape(c.kind)}</td><td>{len(c.ops)}</td>"
        f"<td class='ops'>{html.escape(', '.join(c.ops[:12]))}"
        f"{f' … (+{len(c.ops) - 12})' if len(c.ops) > 12 else ''}</td>"
        f"<td class='ops'>{html.escape(c.reason or '')}</td></tr>" for i, c in enumerate(clusters))
    return (f"{title}<p>{compiled} of {total} TensorFlow ops compiled, in "
            f"{sum(c.kind == 'compiled' for c in clusters)} cluster(s).</p><table class='clusters'>"
            f"<tr><th>#</th><th>kind</th><th>ops</th><th>TensorFlow ops</th><th>why not compiled"
            f"</th></tr>{rows}</table>")


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _machine():
    cpu = platform.processor() or platform.machine()
    if Path("/proc/cpuinfo").exists():
        names = [line.split(":", 1)[1].strip() for line in
                 Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return (f"{cpu}, {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2 ** 30:.0f} GiB RAM; "
            f"{platform.system()} {platform.release()}; Python {platform.python_version()}, "
            f"TensorFlow {_version('tensorflow')}, Keras {_version('keras')}; "
            f"generated {time.strftime('%Y-%m-%d %H:%M')}")


def _notes(notes):
    return "".join(f"<p class='note'>{html.escape(str(text))}</p>" for text in notes)


def speedup_report(runs, path, *, title="kerasjit speedup report", explanations=None, notes=None):
    """Write one self-contained HTML report; returns its Path.

    runs: a list of 2+ runs (the first is the baseline), or a mapping
    {comparison title: list of runs} for several comparisons on one page. A
    run is a JitProfiler, a (name, DataFrame) pair, or a DataFrame (named by
    `attrs["name"]`). explanations: {run name: kerasjit.explain(...) or its
    str()}, shown under "What was compiled". notes: {comparison title or any
    label: text}; a note whose key is a comparison title is shown in it, the
    others at the top. Bad input raises before anything is written (see the
    module docstring).
    """
    comparisons = _comparisons(runs)
    notes = dict(notes or {})
    titles = {t for t, _ in comparisons}
    general = [f"{k}: {v}" for k, v in notes.items() if k not in titles]
    body = [f"<h1>{html.escape(title)}</h1><p class='machine'>{html.escape(_machine())}</p>",
            _notes(general)]
    for comparison, group in comparisons:
        if comparison is not None:
            body.append(f"<h2>{html.escape(str(comparison))}</h2>")
        if not group[0].epochs:
            body.append("<p class='note'>The baseline recorded no epochs: no speedups.</p>")
        body += [_notes([notes[comparison]] if comparison in notes else []),
                 _differing_epochs_note(group), _summary(group, explanations or {}),
                 _charts(group),
                 "<h3>Per epoch</h3>",
                 *(_epoch_table(run) for run in group)]
    body.append(_column_legend([run for _, group in comparisons for run in group]))
    if explanations:
        body.append("<h2>What was compiled</h2>")
        body += [_explanation(name, explained) for name, explained in explanations.items()]
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{html.escape(title)}</title><style>{CSS}</style></head>
<body>
{"".join(body)}
</body></html>
"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path

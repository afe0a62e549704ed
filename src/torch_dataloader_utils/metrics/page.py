"""The HTML report of ``tdu profile`` (`write_page`): one file, no network (the pictures are
inline SVG drawn here), a person would rather look at than read: throughput over time, where
each stage's time goes, and the wait for each batch, for each configuration run, then the
advice."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .clock import STAGES

__all__ = ["Run", "write_page"]

_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
_STAGE_COLOURS = dict(
    zip(STAGES, ("#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974"), strict=True)
)
_W, _H, _PAD = 760, 300, 56


@dataclass
class Run:
    """One configuration's run (`cli.profile.run_one`).

    Attributes:
        workers: DataLoader workers.
        prefetch: their ``prefetch_factor`` (0: none).
        rows: rows delivered.
        seconds: the run's time reading (after the loader was made).
        first_batch_s: from making the loader to its first batch.
        planning_s: making the loader (listing, planning).
        waits: each batch's exposed wait (seconds).
        at: when each batch was handed out (seconds since reading began).
        batch_rows: each batch's rows.
        stages: seconds in each of `STAGES`, over the rank's processes.
        per_process: ``<process>_read_s``, ``<process>_make_s``, ``<process>_batches``.
    """

    workers: int
    prefetch: int
    rows: int
    seconds: float
    first_batch_s: float
    planning_s: float
    waits: np.ndarray
    at: np.ndarray
    batch_rows: np.ndarray
    stages: dict[str, float]
    per_process: dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """Its workers, and its prefetch_factor when not the default."""
        return f"{self.workers}" + (f" (prefetch {self.prefetch})" if self.prefetch > 2 else "")

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait_share(self) -> float:
        """The share of the reading time the loop spent waiting (here: no training step, so
        near 1 means the loader is the bottleneck of a loop that does nothing else)."""
        return float(self.waits.sum()) / self.seconds if self.seconds > 0 else 0.0

    def stage_per_batch(self, stage: str) -> float:
        """Seconds of ``stage`` a batch (a worker's stages over the batches the workers made)."""
        return self.stages.get(stage, 0.0) / max(1, len(self.batch_rows))


def write_page(path: Path, runs: list[Run], advice: tuple[int, int, str], *, title: str) -> None:
    """Write the report of ``runs`` to ``path``."""
    workers, prefetch, why = advice
    rows = "".join(
        f"<tr><td>{r.label}</td><td>{r.rows_per_s:,.0f}</td><td>{r.first_batch_s:.3f} s</td>"
        f"<td>{r.planning_s:.3f} s</td><td>{100 * r.wait_share:.1f}%</td>"
        + "".join(f"<td>{1e3 * r.stage_per_batch(s):.3f}</td>" for s in STAGES)
        + "</tr>"
        for r in runs
    )
    heads = "".join(f"<th>{s} ms/batch</th>" for s in STAGES)
    body = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 820px; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
.advice {{ background: #eef6ee; border: 1px solid #9c9; padding: 0.8em; margin: 1em 0; }}
figure {{ margin: 1.5em 0; }} figcaption {{ font-size: 13px; color: #555; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<div class="advice"><b>Recommended: num_workers={workers}, prefetch_factor={prefetch}.</b>
{html.escape(why)}</div>
<table><tr><th>workers</th><th>rows/s</th><th>first batch</th><th>planning</th>
<th>waiting</th>{heads}</tr>{rows}</table>
<figure>{_throughput(runs)}<figcaption>Throughput over time: rows a second, in quarter-second
bins, for each configuration.</figcaption></figure>
<figure>{_stages(runs)}<figcaption>Where the time goes: milliseconds a batch in each stage
(read: waiting for rows, fetching and decoding them; make: gathering, converting, packing;
queue: the main process waiting for a worker's batch; unpack; device: the copy). A worker's
stages run beside the others'.</figcaption></figure>
<figure>{_waits(runs)}<figcaption>The wait for each batch: from asking the loader for it to
having it, in milliseconds.</figcaption></figure>
<script>
document.body.dataset.drawn = document.querySelectorAll("svg polyline, svg rect.bar").length;
</script>
</body></html>
"""
    path.write_text(body)


def _frame(name: str, x_label: str, y_label: str, top: float, right: float) -> list[str]:
    parts = [
        f'<svg id="{name}" class="chart" xmlns="http://www.w3.org/2000/svg" width="{_W}" '
        f'height="{_H}" viewBox="0 0 {_W} {_H}" font-size="11">',
        f'<rect width="{_W}" height="{_H}" fill="white"/>',
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - 20}" y2="{_H - _PAD}" stroke="#888"/>',
        f'<line x1="{_PAD}" y1="20" x2="{_PAD}" y2="{_H - _PAD}" stroke="#888"/>',
        f'<text x="{_W // 2}" y="{_H - 14}" text-anchor="middle">{x_label}</text>',
        f'<text x="14" y="{_H // 2}" transform="rotate(-90 14 {_H // 2})" '
        f'text-anchor="middle">{y_label}</text>',
    ]
    for i in range(5):
        value = top * i / 4
        y = _y(value, top)
        parts.append(
            f'<line x1="{_PAD}" y1="{y:.1f}" x2="{_W - 20}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{_PAD - 4}" y="{y + 4:.1f}" text-anchor="end">{_short(value)}</text>'
        )
    parts.append(
        f'<text x="{_W - 20}" y="{_H - _PAD + 14}" text-anchor="end">{_short(right)}</text>'
    )
    return parts


def _x(value: float, right: float) -> float:
    return _PAD + (_W - 20 - _PAD) * value / right if right > 0 else _PAD


def _y(value: float, top: float) -> float:
    return (_H - _PAD) - (_H - _PAD - 20) * value / top if top > 0 else _H - _PAD


def _short(value: float) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.3g}"


def _legend(parts: list[str], runs: list[Run]) -> None:
    for i, r in enumerate(runs):
        x = _PAD + 10 + 150 * i
        colour = _COLOURS[i % len(_COLOURS)]
        parts.append(
            f'<rect x="{x}" y="6" width="12" height="4" fill="{colour}"/>'
            f'<text x="{x + 16}" y="12">{r.label} w</text>'
        )


def _throughput(runs: list[Run]) -> str:
    series = []
    for r in runs:
        if not len(r.at):
            series.append((np.zeros(0), np.zeros(0)))
            continue
        bins = np.arange(0.0, max(r.seconds, 0.25) + 0.25, 0.25)
        counts, _ = np.histogram(r.at, bins=bins, weights=r.batch_rows[: len(r.at)])
        series.append((bins[1:], counts / 0.25))
    right = max((float(t[-1]) for t, _ in series if len(t)), default=1.0)
    top = max((float(v.max()) for _, v in series if len(v)), default=1.0) * 1.1 or 1.0
    parts = _frame("throughput", "seconds", "rows/s", top, right)
    for i, (t, v) in enumerate(series):
        if len(t):
            points = " ".join(
                f"{_x(a, right):.1f},{_y(b, top):.1f}" for a, b in zip(t, v, strict=True)
            )
            colour = _COLOURS[i % len(_COLOURS)]
            parts.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>'
            )
    _legend(parts, runs)
    return "\n".join([*parts, "</svg>"])


def _stages(runs: list[Run]) -> str:
    height = 40 + 34 * len(runs)
    totals = [sum(r.stage_per_batch(s) for s in STAGES) for r in runs]
    right = max(totals, default=0.0) * 1.1 or 1e-3
    parts = [
        f'<svg id="stages" class="chart" xmlns="http://www.w3.org/2000/svg" width="{_W}" '
        f'height="{height}" viewBox="0 0 {_W} {height}" font-size="11">',
        f'<rect width="{_W}" height="{height}" fill="white"/>',
    ]
    for i, s in enumerate(STAGES):
        x = 110 + 100 * i
        parts.append(
            f'<rect x="{x}" y="6" width="12" height="8" fill="{_STAGE_COLOURS[s]}"/>'
            f'<text x="{x + 16}" y="14">{s}</text>'
        )
    for row, r in enumerate(runs):
        y = 30 + 34 * row
        parts.append(f'<text x="{_PAD + 40}" y="{y + 15}" text-anchor="end">{r.label} w</text>')
        at = 0.0
        for s in STAGES:
            width = r.stage_per_batch(s)
            if width <= 0:
                continue
            x0, x1 = 110 + (_W - 140) * at / right, 110 + (_W - 140) * (at + width) / right
            parts.append(
                f'<rect class="bar" x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 0.5):.1f}" '
                f'height="22" fill="{_STAGE_COLOURS[s]}"><title>{s}: {1e3 * width:.3f} ms'
                "</title></rect>"
            )
            at += width
        parts.append(
            f'<text x="{110 + (_W - 140) * at / right + 4:.1f}" y="{y + 15}">'
            f"{1e3 * at:.2f} ms</text>"
        )
    return "\n".join([*parts, "</svg>"])


def _waits(runs: list[Run]) -> str:
    right = float(max((len(r.waits) for r in runs), default=1)) or 1.0
    top = max((float(np.percentile(r.waits, 99)) for r in runs if len(r.waits)), default=1e-3)
    top = top * 1.2 * 1e3 or 1.0
    parts = _frame("waits", "batch", "wait (ms, cut at the 99th percentile x 1.2)", top, right)
    for i, r in enumerate(runs):
        if not len(r.waits):
            continue
        step = max(1, len(r.waits) // 600)  # (at most 600 points a line)
        points = " ".join(
            f"{_x(k, right):.1f},{_y(min(1e3 * float(w), top), top):.1f}"
            for k, w in zip(range(0, len(r.waits), step), r.waits[::step], strict=False)
        )
        colour = _COLOURS[i % len(_COLOURS)]
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1" points="{points}"/>'
        )
    _legend(parts, runs)
    return "\n".join([*parts, "</svg>"])

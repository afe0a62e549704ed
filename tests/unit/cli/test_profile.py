"""``tdu profile`` on generated data (issue 46): the summary on the terminal, the advice, and
an HTML report a real headless browser (Debian's Chromium) draws without errors, its three
pictures there."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from torch_dataloader_utils.cli import main, make_demo_dataset
from torch_dataloader_utils.cli.profile import recommend
from torch_dataloader_utils.metrics.page import Run

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("profile")
    data = make_demo_dataset(root / "data", 40_000)
    out = root / "report.html"
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(
            ["profile", str(data), "--workers", "0,1", "--seconds", "0.5", "--out", str(out)]
        )
    assert status == 0
    return out, printed.getvalue()


def test_the_summary_ends_with_the_advice(report: tuple[Path, str]) -> None:
    out, printed = report
    lines = printed.splitlines()
    assert any(line.split()[:1] == ["0"] for line in lines)  # a row per configuration
    assert any(line.split()[:1] == ["1"] for line in lines)
    advice = next(line for line in lines if line.startswith("recommended:"))
    assert "num_workers=" in advice and "prefetch_factor=" in advice and "rows/s" in advice
    assert f"report: {out.resolve()}" in printed


def test_the_report_is_one_file_with_its_pictures(report: tuple[Path, str]) -> None:
    out, _ = report
    page = out.read_text()
    for chart in ('id="throughput"', 'id="stages"', 'id="waits"'):
        assert chart in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "<link" not in page  # (nothing from the network)
    assert "Recommended: num_workers=" in page


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("Chromium is not installed: scripts/services.sh installs it (apt)")
        pytest.skip("Chromium is not installed (scripts/services.sh installs it)")
    return found


def test_a_headless_browser_draws_the_report(report: tuple[Path, str], tmp_path: Path) -> None:
    out, _ = report
    browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    url = out.resolve().as_uri()
    dom = subprocess.run(
        [*browser, "--enable-logging=stderr", "--v=0", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # The page's script counted the lines and bars the browser laid out; it ran, without error.
    assert 'data-drawn="' in dom.stdout
    drawn = int(dom.stdout.split('data-drawn="')[1].split('"')[0])
    assert drawn >= 6, drawn
    assert "Uncaught" not in dom.stderr and "SyntaxError" not in dom.stderr
    for chart in ("throughput", "stages", "waits"):
        assert f'id="{chart}"' in dom.stdout
    shot = tmp_path / "report.png"
    subprocess.run(
        [*browser, f"--screenshot={shot}", "--window-size=900,1500", url],
        capture_output=True,
        timeout=120,
        check=True,
    )
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape[:2] == (1500, 900)
    colours = {tuple(p) for p in pixels.reshape(-1, 3)[::97].tolist()}
    assert len(colours) > 20  # (lines, bars and text drawn, not a blank page)


def _run(workers: int, rows_per_s: float, prefetch: int = 2) -> Run:
    waits = np.full(10, 0.001)
    return Run(
        workers,
        prefetch,
        int(rows_per_s),
        1.0,
        0.1,
        0.01,
        waits,
        np.arange(10.0),
        np.full(10, 1),
        {"read": 0.1},
    )


def test_the_advice_takes_fewer_workers_when_as_fast_and_a_deeper_queue_when_it_pays() -> None:
    workers, prefetch, why = recommend([_run(0, 1000), _run(2, 2000), _run(4, 2050)])
    assert (workers, prefetch) == (2, 2) and "fewer workers" in why
    workers, prefetch, why = recommend([_run(0, 1000), _run(2, 2000), _run(2, 2400, 4)])
    assert (workers, prefetch) == (2, 4) and "pays" in why

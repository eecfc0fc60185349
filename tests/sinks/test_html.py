"""report.html as a person sees it: rendered by headless Chromium (Debian's chromium-headless-shell)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import lightning_mlp, quiet_trainer, random_loader, read_report

CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
SEVERITY_RGB = {"critical": (0xC0, 0x39, 0x2B), "warning": (0xE6, 0x7E, 0x22), "info": (0x5D, 0xAD, 0xE2)}
WIDTH, HEIGHT = 1100, 1400


def _screenshot(page: Path, target: Path, height: int = HEIGHT) -> None:
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={WIDTH},{height}", f"--screenshot={target}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium-headless-shell (apt-get install chromium-headless-shell)")
def test_report_html_renders_with_the_diagnoses_in_view(tmp_path: Path) -> None:
    from PIL import Image

    from perfhooks.integrations.lightning import PerfCallback

    out = tmp_path / "perf"
    # A capacity of 1 byte puts every memory sample over the limit: the memory diagnosis fires.
    trainer = quiet_trainer(max_steps=30, callbacks=[PerfCallback(output_dir=out, console=False, schedule=None,
                                                                  memory_capacity_bytes=1)])
    trainer.fit(lightning_mlp(), random_loader(30))
    report = read_report(out)
    assert report["diagnoses"], "the run should have fired a diagnosis"
    shot = tmp_path / "report.png"
    _screenshot(out / "report.html", shot)

    image = Image.open(shot).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    pixels = image.load()
    # The first diagnosis' severity bar (6 px wide, a block's height) is painted in the first screen.
    colour = SEVERITY_RGB[report["diagnoses"][0]["severity"]]
    painted = [(x, y) for y in range(HEIGHT) for x in range(0, 80) if pixels[x, y] == colour]
    assert len(painted) >= 6 * 30, f"diagnosis bar in {colour} not visible ({len(painted)} pixels)"
    # near the top: the verdict comes first. The first bar is the topmost run of painted rows: a later diagnosis of
    # the same severity paints its own bar further down (a loaded machine fires more; one ended at row 724).
    rows = sorted({y for _, y in painted})
    first_bar_end = rows[0]
    for row in rows[1:]:
        if row != first_bar_end + 1:
            break
        first_bar_end = row
    assert first_bar_end < HEIGHT // 2, (rows[0], first_bar_end)
    # The stacked phase chart and the memory line are drawn too (their colours are on the page; a loaded machine
    # fires more diagnoses, shared_host and step_time_variance among them, which push the charts below the first
    # screen: the whole page is looked at for them)
    page = tmp_path / "page.png"
    _screenshot(out / "report.html", page, height=4 * HEIGHT)
    whole = Image.open(page).convert("RGB")
    counts = {colour: count for count, colour in whole.getcolors(maxcolors=WIDTH * 4 * HEIGHT)}

    def pixels_near(rgb: tuple[int, int, int], tolerance: int = 24) -> int:
        return sum(n for c, n in counts.items() if max(abs(a - b) for a, b in zip(c, rgb, strict=True)) <= tolerance)

    # backward: its stacked area beyond its 10 x 10 legend swatches (the area's size follows the run's backward
    # share, which a loaded machine shrinks: 396 pixels under two busy cores)
    assert pixels_near((0x8E, 0x44, 0xAD)) > 250
    assert pixels_near((0x2C, 0x3E, 0x50)) > 300  # the memory line


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium-headless-shell (apt-get install chromium-headless-shell)")
def test_report_html_has_axes_hover_values_run_account_and_top_operators(tmp_path: Path) -> None:
    """Lightning's defaults (validation, checkpoints, progress bar) and one window: the page has step numbers
    and ms ticks on its charts, each step's values under the pointer (SVG titles), the run account as a bar
    and the window's top operators; the run account's evaluation colour is on screen."""
    from PIL import Image

    import perfhooks
    from helpers import default_trainer
    from perfhooks.integrations.lightning import PerfCallback

    out = tmp_path / "perf"
    schedule = perfhooks.Schedule(skip_first=4, warmup=1, active=2)
    callback = PerfCallback(output_dir=out, console=False, schedule=schedule)
    trainer = default_trainer(tmp_path, max_steps=30, callbacks=[callback], val_check_interval=10, limit_val_batches=4)
    trainer.fit(lightning_mlp(), random_loader(30), random_loader(4))
    page = (out / "report.html").read_text()
    report = read_report(out)
    assert ">0 ms</text>" in page and "ms</text>" in page  # y ticks
    steps = report["series"]["global_step"]
    assert steps[0] <= 10 and steps[-1] >= 20
    assert ">10</text>" in page and ">20</text>" in page  # x ticks: round numbers of the framework's steps
    assert f"<title>step {steps[-1]}: " in page  # the last step's values under the pointer
    assert "Where the run&#x27;s time went" in page or "Where the run's time went" in page
    assert 'id="top_operators"' in page and report["windows"][0]["metrics"]["top_operators"]
    assert "ui.perfetto.dev" in page and "perfhooks analyze" in page
    shot = tmp_path / "report.png"
    _screenshot(out / "report.html", shot)
    image = Image.open(shot).convert("RGB")
    counts = {colour: count for count, colour in image.getcolors(maxcolors=WIDTH * HEIGHT)}
    assert counts.get((0x16, 0xA0, 0x85), 0) > 200, "the run account's evaluation segment is drawn"
    assert counts.get((0x55, 0x55, 0x55), 0) > 50, "axis labels are drawn"

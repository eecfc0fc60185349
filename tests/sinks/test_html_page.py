"""Issue 29, items 5-9: what report.html shows, read from the page's own text and SVG."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path
from urllib.parse import unquote

import pytest

from helpers import plain_loop
from perfhooks import Engine, PerfConfig, Schedule
from perfhooks.sinks.console import format_table
from perfhooks.sinks.html import LEFT, STYLE, _memory_line, _series, duration_label


def tick_labels(svg: str) -> list[str]:
    """The y-axis labels: the texts anchored at the end, left of the plot."""
    return re.findall(rf'<text x="{LEFT - 6}" y="[^"]+" text-anchor="end"[^>]*>([^<]*)</text>', svg)


@pytest.mark.parametrize(("ms", "label"), [(1560.0, "1.6 s"), (12_400.0, "12.4 s"), (640.0, "640 ms"),
                                           (15.5, "15.5 ms"), (0.25, "0.25 ms"), (0.0, "0 ms"),
                                           (1_234_000.0, "1234 s")])
def test_durations_on_an_axis_never_use_exponents(ms: float, label: str) -> None:
    assert duration_label(ms) == label


def test_an_axis_over_a_second_is_labelled_in_seconds_that_fit_the_margin() -> None:
    svg = _series({"forward": [1200.0, 1560.0, 1400.0, 1500.0]})
    labels = tick_labels(svg)
    assert labels and not any("e+" in label for label in labels)  # before: "1.56e+03 ms", clipped to ".56e+03 ms"
    assert labels[-1].endswith(" s")
    # 11 px system-ui digits are at most ~7 px wide: the longest label fits the plot's left margin
    assert max(len(label) for label in labels) * 7 <= LEFT - 6


def run_report(tmp_path: Path, **settings) -> tuple[Engine, dict]:
    engine = Engine(PerfConfig(console=False, on_demand=False, analyze_windows=False, **settings), tmp_path, "test")
    plain_loop(engine, steps=4)
    return engine, engine.close()


def test_the_trace_link_works_from_the_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative output_dir: the window's path is relative to where the run started, the page is not there."""
    monkeypatch.chdir(tmp_path)
    run_report(Path("out"), schedule=Schedule(skip_first=1, warmup=0, active=1, repeat=1))
    page = (tmp_path / "out" / "report.html").read_text()
    [href] = re.findall(r'<a href="([^"]+\.pt\.trace\.json\.gz)"', page)
    assert href == "traces/rank0.step1.pt.trace.json.gz"  # before: "out/traces/...", broken from out/report.html
    assert (tmp_path / "out" / unquote(href)).is_file()


def test_a_failed_run_says_so_at_the_top_of_the_page_and_the_table(tmp_path: Path) -> None:
    engine = Engine(PerfConfig(console=False, on_demand=False, schedule=None), tmp_path, "test")
    plain_loop(engine, steps=3)
    engine.phase_start("forward")
    engine.exception(RuntimeError("CUDA error: device-side assert triggered"))
    page = (tmp_path / "report.html").read_text()
    line = "Run FAILED at step 3 (forward): RuntimeError: CUDA error: device-side assert triggered"
    assert f'<div class="status" id="status"><b>{line}; the figures cover the steps before it' in page
    assert page.index('id="status"') < page.index('id="diagnoses"')
    import json

    table = format_table(json.loads((tmp_path / "report.json").read_text()))
    assert table.splitlines()[0].startswith(f"perfhooks: {line}")


def test_a_completed_run_has_no_status_line(tmp_path: Path) -> None:
    _, report = run_report(tmp_path, schedule=None)
    assert 'id="status"' not in (tmp_path / "report.html").read_text()
    assert not format_table(report).startswith("perfhooks: Run")


def test_memory_far_below_capacity_is_scaled_to_the_data() -> None:
    gib = 2**30
    used = [0.70 * gib, 0.74 * gib, 0.76 * gib, 0.75 * gib]
    svg = _memory_line({"series": {"used_bytes": used, "step": [1, 2, 3, 4]}, "capacity_bytes": 24 * gib,
                        "peak_used_bytes": 0.76 * gib, "peak_step": 3, "peak_phase": "backward", "device": "cuda:0"})
    [points] = re.findall(r'<polyline[^>]*points="([^"]+)"', svg)
    ys = [float(pair.split(",")[1]) for pair in points.split()]
    height = 140
    # before: every point within 5 px of the bottom (0.76 of 24 GiB); now the line spans the chart's upper part
    assert min(ys) < height * 0.3
    assert "capacity 24.00 GiB is above the chart (peak 3.2% of it)" in svg
    assert "stroke-dasharray" not in svg  # no capacity line drawn off the chart


def test_memory_near_capacity_draws_the_capacity_line() -> None:
    gib = 2**30
    svg = _memory_line({"series": {"used_bytes": [20 * gib, 22 * gib], "step": [1, 2]}, "capacity_bytes": 24 * gib,
                        "peak_used_bytes": 22 * gib, "peak_step": 2, "peak_phase": "forward", "device": "cuda:0"})
    assert "stroke-dasharray" in svg and "dashed: capacity" in svg


CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")


def screenshot(tmp_path: Path, body: str, width: int = 1000, height: int = 260):
    import subprocess

    from PIL import Image

    page = tmp_path / "chart.html"
    # the report's own style (its font), with the chart at the page's left edge
    page.write_text(f"<!doctype html><html><head><style>{STYLE}</style></head>"
                    f"<body style='margin:0;background:#fff'>{body}</body></html>")
    shot = tmp_path / "chart.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    return Image.open(shot).convert("RGB")


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium-headless-shell (apt-get install chromium-headless-shell)")
def test_rendered_second_labels_are_not_clipped_and_the_memory_line_uses_the_height(tmp_path: Path) -> None:
    chart = re.sub(r'<div class="legend">.*?</div>', "", _series({"forward": [1200.0, 1560.0, 1400.0, 1500.0]}))
    image = screenshot(tmp_path, chart)  # the chart alone, without its caption
    pixels = image.load()

    def inked(x: int, y: int) -> bool:
        return sum(pixels[x, y]) < 600  # darker than the light grid lines (#e5e5e5 sums to 687)

    label_ink = [(x, y) for y in range(180) for x in range(LEFT - 6) if inked(x, y)]
    assert label_ink, "the y labels are drawn"
    # before, "1.56e+03 ms" ran past the SVG's left edge (x = 0) and lost its first digit
    assert min(x for x, _ in label_ink) >= 4
    gib = 2**30
    memory = _memory_line({"series": {"used_bytes": [0.70 * gib, 0.74 * gib, 0.76 * gib, 0.72 * gib],
                                      "step": [1, 2, 3, 4]}, "capacity_bytes": 24 * gib, "peak_used_bytes": 0.76 * gib,
                           "peak_step": 3, "peak_phase": "backward", "device": "cuda:0"})
    image = screenshot(tmp_path, memory)
    pixels = image.load()
    line = [y for y in range(image.size[1]) for x in range(LEFT, 1000, 7)
            if max(abs(a - b) for a, b in zip(pixels[x, y], (0x2C, 0x3E, 0x50), strict=True)) <= 40]
    assert line and max(line) - min(line) >= 30  # before: a flat line within 5 px of the bottom


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium-headless-shell (apt-get install chromium-headless-shell)")
def test_a_failed_runs_status_box_is_painted_above_the_diagnoses(tmp_path: Path) -> None:
    engine = Engine(PerfConfig(console=False, on_demand=False, schedule=None), tmp_path / "run", "test")
    plain_loop(engine, steps=3)
    engine.exception(KeyboardInterrupt())
    page = (tmp_path / "run" / "report.html").read_text()
    assert "Run INTERRUPTED at step 3" in page
    import subprocess

    from PIL import Image

    shot = tmp_path / "page.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1100,600", f"--screenshot={shot}", (tmp_path / "run" / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    image = Image.open(shot).convert("RGB")
    pixels = image.load()
    fill = [y for y in range(600) for x in range(0, 1100, 5) if pixels[x, y] == (0xFD, 0xEC, 0xEA)]
    assert len(fill) > 200 and max(fill) < 300  # the box's pink fill, in the first screen's upper half


# ----------------------------------------------------------------------------- issue 52: charts that look finished
@pytest.mark.parametrize(("top", "expected"), [(473.0, (500.0, 100.0)), (354.0, (400.0, 100.0)),
                                               (0.39, (0.4, 0.1)), (1560.0, (2000.0, 500.0)), (7.0, (8.0, 2.0))])
def test_axis_tops_and_ticks_are_round_one_two_five_steps(top: float, expected: tuple[float, float]) -> None:
    from perfhooks.sinks.html import nice_top

    axis_top, step = nice_top(top)
    assert (axis_top, step) == pytest.approx(expected)
    assert axis_top >= top and round(axis_top / step) <= 5
    assert step / 10 ** math.floor(math.log10(step)) in (1.0, 2.0, 5.0)


def test_every_tick_is_a_round_number_and_the_memory_ticks_are_even() -> None:
    """Before: 473/354/236 ms, 0.39/0.29 GiB, and memory x ticks 0, 6, 10, 13, 20, 27, 35."""
    from perfhooks.sinks.html import _stacked_series

    forward = [473.0, 300.0, 310.0] * 10
    assert tick_labels(_stacked_series({"forward": forward})) == ["0 ms", "100 ms", "200 ms", "300 ms", "400 ms",
                                                                  "500 ms"]
    assert tick_labels(_series({"forward": forward})) == ["0 ms", "200 ms", "400 ms", "600 ms"]  # a small chart
    gib = 2**30
    steps = [0, 1, 3, 6, 8, 9, 10, 12, 13, 13, 15, 17, 20, 22, 25, 27, 30, 32, 35, 37]
    svg = _memory_line({"series": {"used_bytes": [0.35 * gib + i * 1e6 for i in range(20)], "step": steps},
                        "capacity_bytes": 24 * gib, "peak_used_bytes": 0.4 * gib, "peak_step": 37,
                        "peak_phase": "forward", "device": "cuda:0"})
    assert tick_labels(svg) == ["0 GiB", "0.1 GiB", "0.2 GiB", "0.3 GiB", "0.4 GiB", "0.5 GiB"]
    x_labels = re.findall(r'<text x="[^"]+" y="156" text-anchor="(?:middle|end)"[^>]*>([^<]*)</text>', svg)
    assert x_labels == ["0", "5", "10", "15", "20", "25", "30", "35"]
    assert "at each reading" in svg and "per sample" not in svg


def test_few_steps_are_bars_and_each_phase_has_its_own_chart() -> None:
    from perfhooks.sinks.html import _stacked_series

    three = {"forward": [5.0, 6.0, 5.5], "backward": [1.0, 1.2, 1.1]}
    stacked = _stacked_series(three, steps=[10, 11, 12])
    assert stacked.count("<rect") - stacked.count('fill="transparent"') == 6 and "<polygon" not in stacked
    assert "<polygon" in _stacked_series({name: values * 10 for name, values in three.items()})
    small = _series({name: values * 10 for name, values in three.items()})
    assert small.count('aria-label="forward per step"') == 1 and small.count('aria-label="backward per step"') == 1
    assert small.count('class="median"') == 2 and "median of 5 steps" in small  # raw faint, median over it
    assert 'class="median"' not in _series(three)  # 3 points: no median drawn


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium-headless-shell (apt-get install chromium-headless-shell)")
@pytest.mark.parametrize("width", [1000, 1400])
def test_no_chart_or_table_makes_the_page_scroll_sideways(tmp_path: Path, width: int) -> None:
    """A run's page (charts 1000 px wide on their grid) and a trace's page (kernel names of 200 characters) in a
    window of ``width`` px: the document is no wider than the window."""
    import subprocess

    from perfhooks.cli import main

    run_report(tmp_path / "run", schedule=None)
    trace = Path(__file__).parents[1] / "data" / "traces" / "h100" / "fp32_handwritten_attention.pt.trace.json.gz"
    assert main(["analyze", str(trace), "--format", "html", "-o", str(tmp_path / "trace.html")]) == 0
    for page in (tmp_path / "run" / "report.html", tmp_path / "trace.html"):
        probe = page.with_suffix(".probe.html")  # the page, and a script that reads its layout into the title
        probe.write_text(page.read_text() + "<script>document.title = 'scroll ' + document.documentElement.scrollWidth"
                         " + ' client ' + document.documentElement.clientWidth</script>")
        dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={width},900",
                              "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
        scroll, client = map(int, re.search(r"<title>scroll (\d+) client (\d+)</title>", dom).groups())
        assert scroll <= client <= width, (page.name, scroll, client)

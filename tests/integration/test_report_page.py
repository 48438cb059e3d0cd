"""corectl report --html's page in headless Chromium (Debian's package; CI installs it, .ci/run): it
opens without a console error or a failed load, and its screenshot shows each plot, in the series'
colours, with bars as long as their values say. A missing Chromium fails the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from corectl.health import page
from corectl.health.charts import WIDTH
from report_sample import OUTAGES, UNTIL, sample_figures, sample_read
from screenshot import CHROMIUM, bars, runs, screenshot

# one pytest-xdist worker for the module, so that Chromium takes the screenshot once (tests/conftest.py)
pytestmark = pytest.mark.xdist_group("report_page")


@pytest.fixture(scope="module")
def shot(tmp_path_factory: pytest.TempPathFactory):
    assert Path(CHROMIUM).is_file(), f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)"
    where = tmp_path_factory.mktemp("report")
    html = where / "report.html"
    html.write_text(page.report_page("lab", sample_figures(), OUTAGES, sample_read(), UNTIL))
    return screenshot(html, where / "report.png", where / "profile")


def test_the_page_opens_without_errors(shot):
    image, errors = shot
    assert errors == []
    assert (image.width, image.height) == (1200, 2400)


def test_the_bars_of_gpu_hours_are_as_long_as_their_values(shot):
    image, _ = shot
    plot = WIDTH - 220 - 130  # charts.bar_chart's plot width: the largest bar spans it
    # per account: vision 40, hpcadmin 5, research 2 GPU-hours; per user: alice 42, the hostile name 5, carol 0
    assert bars(image, page.ACCOUNT_COLOUR) == pytest.approx([plot, plot * 5 / 40, plot * 2 / 40], abs=1)
    assert bars(image, page.USER_COLOUR) == pytest.approx([plot, plot * 5 / 42], abs=1)


def test_the_utilisation_lines_are_drawn_across_the_period(shot):
    image, _ = shot
    for colour in (page.UTIL_COLOUR, page.BUSY_COLOUR):
        found = runs(image, colour)
        xs = [x for _y, x, _n in found] + [x + n for _y, x, n in found]
        # from the plot's left edge to its right one (a legend square beside the title too)
        assert max(xs) - min(xs) > 700, colour
        assert sum(n for *_, n in found) > 700, colour
    util_rows = sorted({y for y, _x, n in runs(image, page.UTIL_COLOUR) if n > 100})
    assert len(util_rows) >= 2 and util_rows[-1] - util_rows[0] > 50  # the 50% and the 90% stretches


def test_the_timeline_shows_each_outage_for_its_time(shot):
    image, _ = shot
    colours = page.cause_colours(o.cls for o in OUTAGES)
    plot = WIDTH - 140 - 40  # charts.timeline's plot width: the day
    assert bars(image, colours["xid"], min_height=15) == pytest.approx([plot * 6 / 24], abs=2)
    assert bars(image, colours["slurm: Not responding"], min_height=15) == pytest.approx([plot * 12 / 24], abs=2)


def test_the_error_check_sees_a_page_that_fails(tmp_path: Path):
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><script>console.error("boom"); missing();</script></body></html>')
    _, errors = screenshot(bad, tmp_path / "bad.png", tmp_path / "profile")
    assert any('"boom"' in line for line in errors) and any("Uncaught ReferenceError" in line for line in errors)

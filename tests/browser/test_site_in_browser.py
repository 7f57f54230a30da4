"""The static site (`make site`) read the way a learner reads it before installing anything:
index.html and two lessons opened from disk (file://) in headless Chromium, with every request
to anything but the site's own files refused and reported.

Checked on each lesson: it says it is a stored run; every figure decodes and has alt text; the
glossary is folded and opens on a click; the stored dashboard shows as a picture and text (its
setting, its readout, its figure with the figure's alt) with no control that would do nothing;
the lesson bar links to the index and the neighbouring lesson; nothing is asked of the network
and no script fails. On the index: the README's table with a working link.

Only 01 and 05 are built (~5 s): the builder itself is tested on every lesson in tests/test_site.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "playwright.sync_api",
    reason="playwright is not installed: pip install playwright (the dev extra), and "
    "apt-get install chromium for the browser; never `playwright install`",
)

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ["01_one_model_two_speeds", "05_batching"]
NO_ALT = "No description has been provided for this image"  # nbconvert's placeholder


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import build_site
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    paths = [ROOT / "notebooks" / f"{name}.ipynb" for name in LESSONS]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        pytest.fail(f"lessons missing from notebooks/: {missing}")
    out = tmp_path_factory.mktemp("site")
    build_site.build_site(paths, out, log=lambda _: None)
    return out


@pytest.fixture
def page(browser):
    """A page that may load only file: and data: URLs; anything else is aborted and recorded."""
    page = browser.new_page()
    page.offline_refused, page.errors = [], []

    def route(r):
        url = r.request.url
        if url.startswith(("file:", "data:")):
            r.continue_()
        else:
            page.offline_refused.append(url)
            r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda err: page.errors.append(str(err)))
    page.on("console", lambda msg: page.errors.append(msg.text) if msg.type == "error" else None)
    yield page
    page.close()


def test_index_lists_the_lessons_and_links_to_them(site, page):
    page.goto((site / "index.html").as_uri())
    rows = page.locator("table tbody tr")
    assert rows.count() >= 8, "the README's table of notebooks, one row per lesson"
    link = page.locator("a[href='05_batching.html']")
    assert link.count() == 1 and "Batching" in link.inner_text()
    link.click()
    page.wait_for_url("**/05_batching.html")
    assert page.title().startswith("05")
    assert page.offline_refused == [] and page.errors == []


@pytest.mark.parametrize("name", LESSONS)
def test_lesson_page_shows_figures_glossary_and_stored_widgets(site, page, name):
    page.goto((site / f"{name}.html").as_uri())
    notice = page.locator(".il-stored-run")
    assert notice.is_visible() and "A stored run" in notice.inner_text() and "make lab" in notice.inner_text()
    page.wait_for_function(
        "() => [...document.querySelectorAll('img')].every(i => i.complete && i.naturalWidth > 0)", timeout=20_000)
    images = page.evaluate(
        "() => [...document.querySelectorAll('img')].map(i => ({alt: i.getAttribute('alt') || '',"
        " width: i.naturalWidth, widget: !!i.closest('.il-dashboard')}))")
    assert len([i for i in images if not i["widget"]]) >= 1 and any(i["widget"] for i in images), images
    for image in images:
        assert image["width"] > 0 and image["alt"].strip() and image["alt"] != NO_ALT, image

    # The glossary: folded terms that open on a click.
    details = page.locator("details")
    assert details.count() >= 4
    assert page.locator("details[open]").count() == 0
    first = details.first
    body = first.evaluate("d => d.textContent.replace(d.querySelector('summary').textContent, '').trim()")
    assert body and not page.get_by_text(body[:30], exact=False).first.is_visible()
    first.locator("summary").click()
    assert first.evaluate("d => d.open") and page.get_by_text(body[:30], exact=False).first.is_visible()

    # The stored dashboard: the setting of the lesson's sweep as text, its readout, its figure,
    # and no slider, button or input that would move and redraw nothing.
    board = page.locator(".il-dashboard").first
    settings = board.locator(".il-setting").all_inner_texts()
    assert any(s.startswith(("batch size:", "prompt length:")) for s in settings), settings
    readout = board.locator(".inference-lab-readout").first
    assert readout.is_visible() and readout.inner_text().strip()
    assert "Stored view" in board.inner_text()
    assert page.locator("input, button, select, .widget-slider").count() == 0

    # The lesson bar: the index and the neighbouring lesson, both files of the site.
    hrefs = page.locator("nav.il-lessonbar").first.locator("a").evaluate_all("as => as.map(a => a.href)")
    assert any(h.endswith("/index.html") for h in hrefs) and len(hrefs) == 2, hrefs
    for href in hrefs:
        assert (site / href.rsplit("/", 1)[1]).is_file(), href

    assert page.offline_refused == [], f"{name}: the page asked the network for {page.offline_refused}"
    assert page.errors == [], f"{name}: script errors {page.errors}"

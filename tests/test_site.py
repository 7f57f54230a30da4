"""scripts/build_site.py: the stored notebooks as a static site that reads offline.

The pages themselves are opened in Chromium by tests/browser/test_site_in_browser.py; here the
builder is checked without a browser: links, alt texts, the refusals, the vendored script.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbconvert")
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import build_site  # noqa: E402

sys.path.remove(str(ROOT / "scripts"))

PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
README = """# Inference Lab

```bash
make lab
```

A curriculum you can [read](https://example.org) offline.

## The notebooks

| notebook | what you learn |
|---|---|
| `a_first` | the first thing |
| `b_second` | the second thing |
| `c_unbuilt` | a lesson not built here |

## Layout
"""


def _figure_output(alt=None):
    metadata = {"image/png": {"alt": alt}} if alt else {}
    return new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}, metadata=metadata)


def _lesson(path: Path, title: str, cells=()) -> Path:
    nb = new_notebook(cells=[
        new_markdown_cell(f"# {title}\n\n**TL;DR.** Something."),
        new_markdown_cell("### Glossary\n\n<details><summary><b>decode</b></summary>\n\nWriting tokens.\n</details>"),
        new_markdown_cell("## Measure it"),
        new_code_cell("plots.something()", execution_count=1,
                      outputs=[_figure_output("Bars of tokens/s: prefill 3,000 vs decode 120.")]),
        new_code_cell("old_figure()", execution_count=2, outputs=[_figure_output()]),
        *cells,
    ])
    nbformat.write(nb, path)
    return path


def _links(page: str) -> dict:
    """The lesson bar's links (the same at the top and the bottom of the page)."""
    from bs4 import BeautifulSoup

    bars = BeautifulSoup(page, "html.parser").select("nav.il-lessonbar")
    assert len(bars) == 2
    found = [{(a.get("rel") or ["index"])[0]: a["href"] for a in bar.find_all("a")} for bar in bars]
    assert found[0] == found[1]
    return found[0]


@pytest.fixture
def lessons(tmp_path):
    src = tmp_path / "notebooks"
    src.mkdir()
    readme = tmp_path / "README.md"
    readme.write_text(README)
    return src, readme


def test_builds_linked_pages_with_alt_text_and_only_local_scripts(lessons, tmp_path):
    src, readme = lessons
    a = _lesson(src / "a_first.ipynb", "A · First")
    b = _lesson(src / "b_second.ipynb", "B · Second")
    stored = a.read_bytes()
    out = tmp_path / "site"
    report = build_site.build_site([b, a], out, readme=readme, log=lambda _: None)

    assert [p.href for p in report.pages] == ["a_first.html", "b_second.html"]
    assert report.fallback_alts == 2 and all(p.figures == 2 for p in report.pages)
    index = (out / "index.html").read_text()
    assert '<a href="a_first.html">A · First</a>' in index and '<a href="b_second.html">B · Second</a>' in index
    assert "c_unbuilt" in index and "c_unbuilt.html" not in index  # listed, not linked
    assert "example.org" not in index  # the README's links lead out of the site: words only

    first, second = (out / "a_first.html").read_text(), (out / "b_second.html").read_text()
    assert _links(first) == {"next": "b_second.html", "index": "index.html"}
    assert _links(second) == {"prev": "a_first.html", "index": "index.html"}
    assert "<title>A · First</title>" in first
    assert "<details>" in first and "<summary>" in first  # the glossary stays folded
    alts = re.findall(r'<img alt="([^"]*)"', first)
    assert alts == ["Bars of tokens/s: prefill 3,000 vs decode 120.",
                    "Figure drawn by the code above, in the section \u201cMeasure it\u201d of \u201cA · First\u201d"]
    for page in (first, second, index):
        assert build_site.offline_problems(page, out) == []
        assert not re.search(r"<script[^>]+src=\"https?:", page)
    assert (out / "_static" / "embed.js").read_bytes() == (build_site.VENDOR / "embed.js").read_bytes()
    assert a.read_bytes() == stored  # the stored notebook is never touched


def test_a_lesson_with_widgets_loads_the_vendored_manager_and_keeps_their_state(tmp_path):
    """A real lesson: its widget views and their stored state go into the page, and every
    image inside the state gets an alt."""
    lesson = ROOT / "notebooks" / "01_one_model_two_speeds.ipynb"
    if not lesson.exists():
        pytest.fail("notebooks/01_one_model_two_speeds.ipynb is missing")
    out = tmp_path / "site"
    build_site.build_site([lesson], out, log=lambda _: None)
    page = (out / lesson.with_suffix(".html").name).read_text()
    assert '<script src="_static/embed.js"></script>' in page
    assert 'type="application/vnd.jupyter.widget-view+json"' in page
    (state_json,) = re.findall(
        r'<script type="application/vnd.jupyter.widget-state\+json">\s*(.*?)\s*</script>', page, re.S)
    state = json.loads(state_json)["state"]
    images = [o for m in state.values() for o in m["state"].get("outputs", []) if "image/png" in o.get("data", {})]
    assert images and all(o["metadata"]["image/png"]["alt"] for o in images)
    assert build_site.offline_problems(page, out) == []


def test_refuses_pages_that_would_need_the_network(lessons, tmp_path):
    src, readme = lessons
    math = _lesson(src / "a_first.ipynb", "A", [new_markdown_cell("The cost is $2 \\cdot N$ FLOPs.")])
    with pytest.raises(build_site.SiteError, match="TeX math.*MathJax"):
        build_site.build_site([math], tmp_path / "site", readme=readme, log=lambda _: None)
    js = _lesson(src / "a_first.ipynb", "A", [new_code_cell("x", execution_count=3, outputs=[
        new_output("display_data", data={"application/javascript": "fetch('https://x')"})])])
    with pytest.raises(build_site.SiteError, match="JavaScript output"):
        build_site.build_site([js], tmp_path / "site", readme=readme, log=lambda _: None)
    # Prices are not math: one dollar sign does not make a formula.
    assert build_site.needs_the_network(nbformat.v4.new_notebook(
        cells=[new_markdown_cell("Output tokens cost $15 per million.")])) == []
    page = ('<html><head><script src="https://cdn.example/x.js"></script><link rel="stylesheet" '
            'href="//fonts.example/a.css"><style>@import "https://x/y.css";</style></head>'
            '<body><img src="figure.png"><img src="data:image/png;base64,AAAA"></body></html>')
    problems = build_site.offline_problems(page, tmp_path)
    assert len(problems) == 4, problems


def test_every_lesson_is_in_the_readme_table(lessons, tmp_path):
    src, readme = lessons
    stray = _lesson(src / "z_unlisted.ipynb", "Z")
    with pytest.raises(build_site.SiteError, match="does not list.*z_unlisted"):
        build_site.build_site([stray], tmp_path / "site", readme=readme, log=lambda _: None)


def test_the_vendored_widget_manager_is_checked(tmp_path, monkeypatch):
    record = json.loads((build_site.VENDOR / "VENDOR.json").read_text())
    assert record["package"] == "@jupyter-widgets/html-manager"
    assert build_site.vendored_embed_js() == build_site.VENDOR / "embed.js"
    assert hashlib.sha256((build_site.VENDOR / "embed.js").read_bytes()).hexdigest() == record["files"]["embed.js"]
    assert (build_site.VENDOR / "LICENSE").is_file() and (build_site.VENDOR / "embed.js.LICENSE.txt").is_file()
    tampered = tmp_path / "vendor"
    tampered.mkdir()
    (tampered / "VENDOR.json").write_text(json.dumps(record))
    (tampered / "embed.js").write_text("// not the vendored file")
    monkeypatch.setattr(build_site, "VENDOR", tampered)
    with pytest.raises(build_site.SiteError, match="does not match VENDOR.json"):
        build_site.vendored_embed_js()


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_stored_lessons_read_offline_and_are_indexed(path):
    nb = nbformat.read(path, as_version=4)
    assert build_site.needs_the_network(nb) == []
    _, table = build_site.readme_parts((ROOT / "README.md").read_text())
    assert f"`{path.stem}`" in table, f"README.md's notebook table does not list {path.stem}"

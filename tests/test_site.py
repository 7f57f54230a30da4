"""scripts/build_site.py: the stored notebooks as a static site that reads offline.

The pages themselves are opened in Chromium by tests/browser/test_site_in_browser.py; here the
builder is checked without a browser: links, alt texts, the refusals, the stored-run notice, and
the stored widget views drawn as pictures and text, never as dead controls.
"""

from __future__ import annotations

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
    assert "<details" in first and "<summary>" in first  # the glossary stays folded
    alts = re.findall(r'<img alt="([^"]*)"', first)
    assert alts == ["Bars of tokens/s: prefill 3,000 vs decode 120.",
                    "Figure drawn by the code above, in the section \u201cMeasure it\u201d of \u201cA · First\u201d"]
    for page in (first, second, index):
        assert build_site.offline_problems(page, out) == []
        assert not re.search(r"<script[^>]+src=", page)
    assert "A stored run" in first and "make lab" in first
    assert sorted(p.name for p in (out / "_static").iterdir()) == ["site.css"]
    assert a.read_bytes() == stored  # the stored notebook is never touched


@pytest.fixture(scope="module")
def stored_pages(tmp_path_factory):
    """Lessons 01 and 07 built from the stored notebooks (a dashboard, quizzes, predictions, a table)."""
    lessons = [ROOT / "notebooks" / f"{name}.ipynb" for name in ("01_one_model_two_speeds", "07_serving_economics")]
    missing = [p.name for p in lessons if not p.exists()]
    if missing:
        pytest.fail(f"lessons missing from notebooks/: {missing}")
    out = tmp_path_factory.mktemp("site")
    build_site.build_site(lessons, out, log=lambda _: None)
    return {p.stem: (out / f"{p.stem}.html").read_text() for p in lessons}, out


def test_stored_widget_views_become_pictures_and_text(stored_pages):
    """Issue 26: on the site the sliders moved and nothing redrew, "lock in" did nothing. A stored
    view is now its picture, its readout and caption, its settings as text and a line saying what
    the notebook does live; the page runs no script and keeps no control."""
    from bs4 import BeautifulSoup

    pages, out = stored_pages
    page = pages["01_one_model_two_speeds"]
    soup = BeautifulSoup(page, "html.parser")
    assert soup.find("script", src=True) is None and "widget-state+json" not in page and "widget-view+json" not in page
    assert not soup.select("input, button, select, .widget-slider"), "a control that would do nothing"
    (board,) = soup.select(".il-widget.il-dashboard")
    assert "Stored view" in board.get_text() and board.select_one(".inference-lab-readout").get_text(strip=True)
    assert re.search(r"prompt length: \d+ \(its positions: \d+, \d+", board.get_text()), board.get_text()
    (figure,) = board.find_all("img")
    assert figure["src"].startswith("data:image/png;base64,") and figure["alt"].startswith("Timeline of one request")
    predictions = soup.select(".il-widget.il-prediction")
    assert predictions and all("Decide on your answer before you read on" in p.get_text() for p in predictions)
    quizzes = soup.select(".il-widget.il-quiz")
    assert quizzes and all(q.select("li") or "check" in q.get_text() for q in quizzes)
    assert build_site.offline_problems(page, out) == []


def test_the_lessons_markdown_tables_are_tables(stored_pages):
    """Issue 26: 07's metric table printed as raw ``| ... |`` text on the site."""
    from bs4 import BeautifulSoup

    pages, _ = stored_pages
    for name, page in pages.items():
        text = BeautifulSoup(page, "html.parser").select_one("main, body").get_text()
        raw = [line for line in text.splitlines() if re.match(r"^\s*\|.*\|\s*$", line) and "---" in line]
        assert raw == [], f"{name}: markdown table left as text: {raw[:2]}"
    assert "<table>" in pages["07_serving_economics"]


def test_a_widget_without_a_static_form_is_refused():
    state = {"a": {"model_name": "VBoxModel", "state": {"children": ["IPY_MODEL_b", "IPY_MODEL_c", "IPY_MODEL_d"]}},
             "b": {"model_name": "SelectionSliderModel", "state": {"description": "batch size", "index": 2,
                                                                   "_options_labels": ["1", "8", "64"]}},
             "c": {"model_name": "RadioButtonsModel", "state": {"index": 0, "_options_labels": ["x", "y"]}},
             "d": {"model_name": "ButtonModel", "state": {"description": "check"}}}
    shown = build_site.static_widget(state, "a", "t.ipynb")
    assert "batch size: <b>64</b> (its positions: 1, 8, 64)" in shown
    assert "<li>x (chosen)</li><li>y</li>" in shown and "check" not in shown
    state["d"]["model_name"] = "ColorPickerModel"
    with pytest.raises(build_site.SiteError, match="t.ipynb: a stored ColorPickerModel widget has no static form"):
        build_site.static_widget(state, "a", "t.ipynb")


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


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_stored_lessons_read_offline_and_are_indexed(path):
    nb = nbformat.read(path, as_version=4)
    assert build_site.needs_the_network(nb) == []
    _, table = build_site.readme_parts((ROOT / "README.md").read_text())
    assert f"`{path.stem}`" in table, f"README.md's notebook table does not list {path.stem}"


def test_the_labs_own_widgets_have_a_static_form():
    """The state of real lab widgets (a dashboard, a quiz, a prediction), as a notebook stores it,
    drawn by the builder: each with its line, no control, the dashboard's picture kept."""
    W = pytest.importorskip("ipywidgets")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from inference_lab import widgets

    def view(batch):
        fig, ax = plt.subplots()
        ax.plot([1, 2], [1, batch])
        return fig, f"batch size {batch}: fine"

    made = {"dashboard": widgets.dashboard(view, [widgets.Control("batch", "batch size", [1, 8], 8)],
                                           measure_again=lambda: None),
            "quiz": widgets.quiz("Which?", ["a", "b"], "a", "because"),
            "prediction": widgets.prediction("How many?", ranges=[("few", 0, 5), ("many", 5, 99)])}
    state = W.Widget.get_manager_state(drop_defaults=False)["state"]
    shown = {k: build_site.static_widget(state, w.model_id, "t.ipynb") for k, w in made.items()}
    assert "batch size: <b>8</b> (its positions: 1, 8)" in shown["dashboard"] and "Stored view" in shown["dashboard"]
    assert '<img src="data:image/png;base64,' in shown["dashboard"] and "batch size 8: fine" in shown["dashboard"]
    assert "<li>a</li><li>b</li>" in shown["quiz"] and "press \u201ccheck\u201d" in shown["quiz"]
    assert "How many?" in shown["prediction"] and "<li>few</li><li>many</li>" in shown["prediction"]
    assert "No prediction yet" not in shown["prediction"] and "Decide on your answer" in shown["prediction"]
    for html_text in shown.values():
        assert "measure again" not in html_text and "lock in" not in html_text and "<input" not in html_text


def test_the_first_use_of_a_glossary_term_links_to_its_entry():
    """Issue 36: a reader who meets a word can open its meaning. Each glossary entry gets an
    anchor; the first use of each of its names after the glossary links there, once; code spans,
    headings and the glossary itself are left alone."""
    from nbformat.v4 import new_markdown_cell, new_notebook

    nb = new_notebook(cells=[
        new_markdown_cell("# T"),
        new_markdown_cell("The KV cache before the glossary is not linked."),
        new_markdown_cell("### Glossary: terms\n\n<details><summary><b>tensor parallelism (TP)</b></summary>\n\nSplit.\n\n"
                          "</details>\n\n<details><summary><b>KV cache</b></summary>\n\nKeys.\n\n</details>"),
        new_markdown_cell("## The KV cache\n\n```\nthe KV cache in a code block\n```\nA `KV cache` in code, then the KV cache "
                          "in prose, and with TP=4 the KV cache again."),
    ])
    assert build_site.link_glossary(nb) == 2
    body = nb.cells[3].source
    assert body.count("(#g-kv-cache)") == 1 and "then the [KV cache](#g-kv-cache) in prose" in body
    assert "the KV cache in a code block" in body
    assert "[TP](#g-tensor-parallelism-tp)=4" in body and body.startswith("## The KV cache")
    # an entry's other name later in the lesson is not linked again
    two_names = new_notebook(cells=[
        new_markdown_cell("### Glossary: t\n\n<details><summary><b>tensor parallelism (TP)</b></summary>\n\nS.\n\n</details>"),
        new_markdown_cell("Split by tensor parallelism, TP for short."), new_markdown_cell("Then TP=4 again.")])
    assert build_site.link_glossary(two_names) == 1 and "(#g-" not in two_names.cells[2].source
    assert two_names.cells[1].source == "Split by [tensor parallelism](#g-tensor-parallelism-tp), TP for short."
    assert "`KV cache`" in body and "not linked" in nb.cells[1].source and "(#g-" not in nb.cells[1].source
    assert '<details id="g-kv-cache">' in nb.cells[2].source

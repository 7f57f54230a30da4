"""Build the curriculum as a static site that reads offline: ``make site``.

Each stored notebook becomes one HTML page through nbconvert, from its stored outputs (nothing
is executed). The pages keep JupyterLab's look and the glossaries stay folded (``<details>``).
Each page says at its top that it is a stored run. A stored widget view (a dashboard, a quiz, a
prediction) becomes plain HTML drawn from the widget state the notebook carries
(:func:`static_widget`): its figure as a picture, its readout and caption as text, each slider
as the setting it was left at, a quiz's or a prediction's question with its choices; no control
that would move and do nothing. ``index.html`` holds the README's table of notebooks with a
link to each lesson; every lesson links to the index and to its neighbours.

Nothing is fetched to build the site or to read it, and the pages run no script: the one
stylesheet a page loads is in the site's ``_static/`` folder, and the build fails on a page that
would need anything else (TeX math for MathJax, a Mermaid diagram, a JavaScript output), or whose
HTML points a script, stylesheet or image at another host. Open ``index.html`` from disk or serve
the folder as it is. It needs nbconvert and BeautifulSoup only (``make site`` installs just those).

Every figure gets an ``alt`` text: the one-line description the lab's figures store with their
output (``fig.alt_text``, see inference_lab/plots), or, for outputs stored before the lab did
that, "Figure in the section ... of ...". The build says how many needed the fallback.

Usage: python scripts/build_site.py [--out build/site] [NOTEBOOK ...]
"""

from __future__ import annotations

import argparse
import copy
import html
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE_SOURCES = ROOT / "scripts" / "site"
TEMPLATE_DIR = SITE_SOURCES / "template"
TEMPLATE_NAME = "inference_lab"
STATIC = "_static"

WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
NOTEBOOK_TABLE_HEADING = "## The notebooks"


class SiteError(RuntimeError):
    """The site cannot be built offline as asked; the message says which page and why."""


@dataclass
class Page:
    name: str            # notebook stem, e.g. "05_batching"
    title: str           # the lesson's "# " heading
    href: str            # "05_batching.html"
    figures: int = 0     # <img> outputs on the page (cells and widget views)
    fallback_alts: int = 0


@dataclass
class SiteReport:
    out: Path
    pages: list[Page] = field(default_factory=list)

    @property
    def fallback_alts(self) -> int:
        return sum(p.fallback_alts for p in self.pages)


# --------------------------------------------------------------------------- reading lessons
def _plain(markdown_text: str) -> str:
    """A heading's words without markdown emphasis, code marks or links."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", markdown_text)
    return re.sub(r"[*_`]", "", text).strip()


def lesson_title(nb, fallback: str) -> str:
    """The text of the notebook's first ``# `` heading."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return _plain(line[2:])
    return fallback


def _headings(nb, title: str) -> list[str]:
    """For each cell, the last heading at or above it (the lesson's title before any)."""
    current, out = title, []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                m = re.match(r"#{1,6}\s+(.*)", line)
                if m:
                    current = _plain(m.group(1))
        out.append(current)
    return out


GLOSSARY_ENTRY = re.compile(r"<details><summary><b>(.+?)</b></summary>")


def _slug(term: str) -> str:
    return "g-" + re.sub(r"[^a-z0-9]+", "-", _plain(re.sub(r"<[^>]+>", "", term)).lower()).strip("-")


def _aliases(term: str) -> list[str]:
    """The words a lesson uses for a glossary term: ``"tensor parallelism (TP)"`` is used as
    either; ``"TTFT, TPOT, ITL"`` as each; a parenthesis that is not an acronym is a gloss."""
    term = _plain(re.sub(r"<[^>]+>", "", term))
    head, _, paren = term.partition(" (")
    names = [n.strip() for n in re.split(r",\s|\s/\s|\sor\s", head) if len(n.strip()) > 1]
    paren = paren.rstrip(")")
    if re.fullmatch(r"[A-Z][A-Za-z0-9-]*", paren):
        names.append(paren)
    return names


def link_glossary(nb) -> int:
    """Give every glossary entry an anchor and link the first use of each term after its glossary
    cell to it (the site's pages: a reader meets a word and can open its meaning). Code spans,
    headings, links and the glossary cells themselves are left alone. Returns the links made."""
    made, anchors, seen_glossary = 0, {}, False
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        if "Glossary" in cell.source.split("\n", 1)[0] and GLOSSARY_ENTRY.search(cell.source):
            seen_glossary = True
            for term in GLOSSARY_ENTRY.findall(cell.source):
                anchors.update({alias: _slug(term) for alias in _aliases(term) if alias not in anchors})
            cell.source = GLOSSARY_ENTRY.sub(lambda m: f'<details id="{_slug(m.group(1))}"><summary><b>{m.group(1)}</b>'
                                             "</summary>", cell.source)
            continue
        if not seen_glossary:
            continue
        lines = cell.source.split("\n")
        fenced, inside = set(), False                               # lines of ``` code blocks
        for i, line in enumerate(lines):
            if line.lstrip().startswith("```"):
                inside = not inside
            if inside or line.lstrip().startswith("```"):
                fenced.add(i)
        for alias in sorted(anchors, key=len, reverse=True):       # "KV cache" before "KV"
            if alias not in anchors:                                 # its entry was linked under another name
                continue
            word = re.compile(rf"(?<![\w`\[#-]){re.escape(alias)}(?![\w`\]-])")
            for i, line in enumerate(lines):
                if i in fenced or line.lstrip().startswith(("#", "<")):
                    continue
                outside = re.split(r"(`[^`]*`|\[[^\]]*\]\([^)]*\))", line)   # never inside code or a link
                hit = next((j for j, part in enumerate(outside) if j % 2 == 0 and word.search(part)), None)
                if hit is None:
                    continue
                outside[hit] = word.sub(lambda m: f"[{m.group(0)}](#{anchors[alias]})", outside[hit], count=1)
                lines[i] = "".join(outside)
                made += 1
                break
            else:
                continue
            anchors = {a: s for a, s in anchors.items() if s != anchors[alias]}   # one link per entry
        cell.source = "\n".join(lines)
    return made


def needs_the_network(nb) -> list[str]:
    """Why a page of ``nb`` would need a script from elsewhere (empty: it reads offline).

    MathJax and Mermaid are not vendored (the lessons use neither), and a JavaScript output
    may load anything, so each of them is refused rather than fetched from a CDN.
    """
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    class _MathSpotter(IPythonRenderer):
        found: list[str] = []

        def block_math(self, body):
            self.found.append(body)
            return super().block_math(body)

        def inline_math(self, body):
            self.found.append(body)
            return super().inline_math(body)

        def latex_environment(self, name, body):
            self.found.append(body)
            return super().latex_environment(name, body)

        def multiline_math(self, text):
            self.found.append(text)
            return super().multiline_math(text)

    reasons = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            spotter = _MathSpotter(escape=False)
            spotter.found = []
            MarkdownWithMath(renderer=spotter).render(cell.source)
            if spotter.found:
                reasons.append(f"cell {i}: TeX math ({spotter.found[0][:40]!r}) needs MathJax, which the "
                               "site does not carry; write it in words")
            if re.search(r"^```\s*mermaid", cell.source, re.M):
                reasons.append(f"cell {i}: a Mermaid diagram needs mermaid.js, which the site does not vendor")
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "application/javascript" in data:
                reasons.append(f"cell {i}: a JavaScript output (it may load anything from anywhere)")
            if "text/vnd.mermaid" in data:
                reasons.append(f"cell {i}: a Mermaid output needs mermaid.js")
    return reasons


def _widget_outputs(state: dict, model_id: str, seen=None):
    """Every output of the Output widgets under ``model_id`` in the stored widget state."""
    seen = set() if seen is None else seen
    if model_id in seen or model_id not in state:
        return
    seen.add(model_id)
    model = state[model_id].get("state", {})
    yield from model.get("outputs", [])
    for value in model.values():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and item.startswith("IPY_MODEL_"):
                yield from _widget_outputs(state, item[len("IPY_MODEL_"):], seen)


def describe_figures(nb, title: str) -> tuple[int, int]:
    """Give every stored PNG (cell outputs and widget views) an ``alt`` in its output metadata.

    Outputs that carry one (the lab's figures store ``fig.alt_text``) keep it; the others get
    "Figure in the section ... of <title>". Changes ``nb`` in place (the builder passes a
    copy); returns (figures, fallbacks).
    """
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    figures = fallbacks = 0

    def ensure_alt(out, where):
        nonlocal figures, fallbacks
        if "image/png" not in out.get("data", {}):
            return
        figures += 1
        md = out.setdefault("metadata", {}).setdefault("image/png", {})
        if not str(md.get("alt", "")).strip():
            md["alt"] = f"Figure {where}, in the section \u201c{heading}\u201d of \u201c{title}\u201d"
            fallbacks += 1

    for cell, heading in zip(nb.cells, _headings(nb, title)):
        for out in cell.get("outputs", []):
            ensure_alt(out, "drawn by the code above")
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view:
                for wout in _widget_outputs(state, view["model_id"]):
                    ensure_alt(wout, "of the interactive view")
    return figures, fallbacks


# --------------------------------------------------------------------------- stored widget views
# The lab's widgets carry a CSS class saying what they are: inference_lab/widgets.py's *_CLASS,
# written out here because the site's environment has no ipywidgets to import them with
# (tests/test_site.py draws real widgets through them).
DASHBOARD, QUIZ, PREDICTION = "inference-lab-dashboard", "inference-lab-quiz", "inference-lab-prediction"
# Inputs and buttons: on a page nothing would happen when they are used, so they are left out.
DEAD_CONTROLS = {"ButtonModel", "FloatTextModel", "BoundedFloatTextModel", "IntTextModel", "BoundedIntTextModel",
                 "TextModel", "TextareaModel", "CheckboxModel", "ToggleButtonModel"}
CHOICES = {"RadioButtonsModel", "ToggleButtonsModel", "DropdownModel", "SelectModel"}
SLIDERS = {"SelectionSliderModel", "IntSliderModel", "FloatSliderModel", "FloatLogSliderModel"}
NOTES = {
    DASHBOARD: "Stored view: the dashboard as this run left it. In the notebook, the sliders redraw it "
               "from your machine's measurements.",
    QUIZ: "In the notebook, pick an answer and press \u201ccheck\u201d to see whether it holds, and why.",
    PREDICTION: "Decide on your answer before you read on: the measurement below is folded until you open "
                "it. In the notebook you lock your prediction in here, before your machine measures.",
}


def _children(model: dict) -> list[str]:
    return [c[len("IPY_MODEL_"):] for c in model.get("children", []) if str(c).startswith("IPY_MODEL_")]


def _output_html(out: dict) -> str:
    data = out.get("data", {})
    if "image/png" in data:
        alt = str(out.get("metadata", {}).get("image/png", {}).get("alt", ""))
        return (f'<img src="data:image/png;base64,{html.escape(str(data["image/png"]).strip())}" '
                f'alt="{html.escape(alt)}">')
    if "text/html" in data:
        return "".join(data["text/html"])
    text = "".join(out.get("text", "")) if out.get("output_type") == "stream" else "".join(data.get("text/plain", ""))
    return f"<pre>{html.escape(text)}</pre>" if text else ""


def static_widget(state: dict, model_id: str, where: str) -> str:
    """The stored view of widget ``model_id`` as plain HTML (``where``: the page, for errors).

    Boxes keep their children in order; HTML widgets their HTML; an Output widget its outputs
    (a PNG as an ``<img>`` with its alt); a slider becomes the setting it was left at and its
    positions; a choice its options, the chosen one marked; inputs and buttons are left out. A
    dashboard, a quiz or a prediction of the lab's widgets gets one line saying what the page
    shows instead of the live control. A widget of another kind is refused, not dropped.
    """
    entry = state.get(model_id)
    if entry is None:
        return ""
    name, model = entry.get("model_name", ""), entry.get("state", {})
    kind = next((k for k in (DASHBOARD, QUIZ, PREDICTION) if k in model.get("_dom_classes", [])), None)
    if name in ("VBoxModel", "HBoxModel", "BoxModel", "GridBoxModel"):
        children = _children(model)
        if kind == PREDICTION:
            children = children[:-1]   # its status line ("No prediction yet: ..."), which the note replaces
        inner = "".join(static_widget(state, child, where) for child in children)
        box = "il-hbox" if name == "HBoxModel" else "il-vbox"
        note = f'<p class="il-note">{NOTES[kind]}</p>' if kind else ""
        classes = f"il-widget {box}" + (f" il-{kind.rsplit('-', 1)[1]}" if kind else "")
        return f'<div class="{classes}">{inner}{note}</div>'
    if name in ("HTMLModel", "HTMLMathModel"):
        return f'<div class="il-html {" ".join(model.get("_dom_classes", []))}">{model.get("value", "")}</div>'
    if name == "LabelModel":
        return f"<div>{html.escape(str(model.get('value', '')))}</div>"
    if name == "OutputModel":
        return "".join(_output_html(out) for out in model.get("outputs", []))
    if name in SLIDERS:
        labels = model.get("_options_labels")
        value = labels[model.get("index") or 0] if labels else model.get("value")
        positions = f" (its positions: {', '.join(labels)})" if labels else f" (from {model.get('min')} to {model.get('max')})"
        return (f'<p class="il-setting">{html.escape(str(model.get("description", "")))}: '
                f"<b>{html.escape(str(value))}</b>{html.escape(positions)}</p>")
    if name in CHOICES:
        chosen = model.get("index")
        items = "".join(f"<li>{html.escape(str(label))}{' (chosen)' if i == chosen else ''}</li>"
                        for i, label in enumerate(model.get("_options_labels", [])))
        return f'<ul class="il-choices">{items}</ul>'
    if name in DEAD_CONTROLS:
        return ""
    raise SiteError(f"{where}: a stored {name} widget has no static form; add one to build_site.static_widget")


def render_stored_widgets(nb, where: str) -> None:
    """Replace every stored widget view of ``nb`` by its static HTML, and drop the widget state
    (nothing on the page draws widgets). Changes ``nb`` in place."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        for i, out in enumerate(cell.get("outputs", [])):
            view = out.get("data", {}).get(WIDGET_VIEW)
            if view:
                cell.outputs[i] = {"output_type": "display_data", "metadata": {},
                                   "data": {"text/html": static_widget(state, view["model_id"], where)}}
    nb.metadata.pop("widgets", None)


def stored_run(nb) -> str:
    """When the notebook was run (its last cell's finish, from nbclient's timing), or ""."""
    stamps = [cell.get("metadata", {}).get("execution", {}).get("shell.execute_reply", "")
              for cell in nb.cells if cell.cell_type == "code"]
    stamps = [s for s in stamps if s]
    return max(stamps)[:10] if stamps else ""


# --------------------------------------------------------------------------- checking pages
def offline_problems(page_html: str, folder: Path) -> list[str]:
    """Scripts, stylesheets, images and frames the page would load from elsewhere or that are
    missing from ``folder`` (data: URIs are fine: they are in the page)."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(page_html, "html.parser")
    problems = []
    for tag, attr in (("script", "src"), ("link", "href"), ("img", "src"), ("iframe", "src"),
                      ("source", "src"), ("video", "src"), ("audio", "src"), ("embed", "src")):
        for el in soup.find_all(tag):
            url = el.get(attr)
            if not url or (tag == "link" and "stylesheet" not in (el.get("rel") or [])
                           and "preload" not in (el.get("rel") or [])):
                continue
            if url.startswith("data:"):
                continue
            if re.match(r"^[a-z][a-z0-9+.-]*:|^//", url, re.I):
                problems.append(f"<{tag} {attr}={url!r}> loads from another host")
            elif not (folder / url.split("#")[0].split("?")[0]).is_file():
                problems.append(f"<{tag} {attr}={url!r}> is not in the site folder")
    for style in soup.find_all("style"):
        for url in re.findall(r"url\(\s*['\"]?((?:https?:)?//[^'\")\s]+)", style.get_text()):
            problems.append(f"a stylesheet loads {url}")
        for url in re.findall(r"@import\s+['\"]((?:https?:)?//[^'\"]+)", style.get_text()):
            problems.append(f"a stylesheet imports {url}")
    return problems


# --------------------------------------------------------------------------- the index page
def readme_parts(readme_text: str) -> tuple[str, str]:
    """(the introduction, the notebook table) of the README, as markdown.

    The introduction is the prose between the first code block and the next ``## `` heading;
    the table is the one under ``## The notebooks``.
    """
    intro = ""
    m = re.search(r"^```.*?^```\s*$(.*?)^## ", readme_text, re.S | re.M)
    if m:
        intro = m.group(1).strip()
    start = readme_text.find(NOTEBOOK_TABLE_HEADING)
    if start < 0:
        raise SiteError(f"README.md has no {NOTEBOOK_TABLE_HEADING!r} section to build the index from")
    lines = readme_text[start:].splitlines()[1:]
    table = []
    for line in lines:
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    if len(table) < 3:
        raise SiteError(f"README.md: no table under {NOTEBOOK_TABLE_HEADING!r}")
    return intro, "\n".join(table)


def index_html(readme_text: str, pages: list[Page]) -> str:
    """The index: the README's introduction and its table of notebooks, each built one linked."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    intro, table = readme_parts(readme_text)
    by_name = {p.name: p for p in pages}
    listed = set(re.findall(r"^\|\s*`([^`]+)`", table, re.M))
    unlisted = sorted(set(by_name) - listed)
    if unlisted:
        raise SiteError(f"README.md's notebook table does not list {unlisted}: add a row for each lesson")

    def link(m):
        page = by_name.get(m.group(2))
        if page is None:
            return m.group(0)
        return f"{m.group(1)}[{page.title}]({page.href})<br>`{page.name}`"

    table = re.sub(r"^(\|\s*)`([^`]+)`", link, table, flags=re.M)
    # Links in the introduction point into the repository or the web, not into the site:
    # keep their words only.
    intro = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", intro)
    first = pages[0].href if pages else None
    start = f'<p><a href="{first}">Start with the first lesson &rarr;</a></p>' if first else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>Inference Lab</title>
<link rel="stylesheet" href="{STATIC}/site.css">
</head>
<body>
<main class="il-index-page">
<h1>Inference Lab</h1>
{markdown2html_mistune(intro)}
<h2>The lessons</h2>
{markdown2html_mistune(table)}
{start}
<p class="il-note">These pages show each notebook as it was last run, with its stored figures and
widget views. To run the lessons and move the sliders yourself, clone the repository and
type <code>make lab</code>.</p>
</main>
</body>
</html>
"""


# --------------------------------------------------------------------------- building
def build_site(notebooks, out: Path, *, readme: Path = ROOT / "README.md", log=print) -> SiteReport:
    """Write ``out/index.html``, one page per notebook and ``out/_static/``; return a report."""
    import nbformat
    from nbconvert import HTMLExporter

    notebooks = sorted(Path(p) for p in notebooks)
    if not notebooks:
        raise SiteError("no notebooks to build")
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    (out / STATIC).mkdir(parents=True)
    shutil.copyfile(SITE_SOURCES / "static" / "site.css", out / STATIC / "site.css")

    loaded = [(path, nbformat.read(path, as_version=4)) for path in notebooks]
    problems = [f"{path.name}: {why}" for path, nb in loaded for why in needs_the_network(nb)]
    if problems:
        raise SiteError("these pages would need scripts from the network:\n  " + "\n  ".join(problems))
    pages = [Page(path.stem, lesson_title(nb, path.stem), f"{path.stem}.html") for path, nb in loaded]

    exporter = HTMLExporter(template_name=TEMPLATE_NAME, extra_template_basedirs=[str(TEMPLATE_DIR)])
    report = SiteReport(out=out, pages=pages)
    for i, ((path, nb), page) in enumerate(zip(loaded, pages)):
        nb = copy.deepcopy(nb)  # alt texts and static views go into the copy; the stored notebook is untouched
        page.figures, page.fallback_alts = describe_figures(nb, page.title)
        render_stored_widgets(nb, path.name)
        link_glossary(nb)
        site = {
            "static": STATIC,
            "stored_run": stored_run(nb),
            "index": "index.html",
            "previous": {"href": pages[i - 1].href, "title": pages[i - 1].title} if i > 0 else None,
            "next": {"href": pages[i + 1].href, "title": pages[i + 1].title} if i + 1 < len(pages) else None,
        }
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": page.title}, "site": site})
        problems = offline_problems(body, out)
        if problems:
            raise SiteError(f"{path.name}: the page would not read offline:\n  " + "\n  ".join(problems))
        (out / page.href).write_text(body, encoding="utf-8")
        log(f"  {page.href}: {page.figures} figures"
            + (f" ({page.fallback_alts} described by their section: stored before figures carried "
               "a description; `make notebooks` stores them)" if page.fallback_alts else ""))

    index = index_html(Path(readme).read_text(encoding="utf-8"), pages)
    problems = offline_problems(index, out)
    if problems:
        raise SiteError("index.html would not read offline:\n  " + "\n  ".join(problems))
    (out / "index.html").write_text(index, encoding="utf-8")
    log(f"site: {len(pages)} lessons and index.html in {out} (open {out / 'index.html'})")
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Build the static site of the stored notebooks (offline).")
    parser.add_argument("notebooks", nargs="*", help="notebooks to build (default: notebooks/*.ipynb)")
    parser.add_argument("--out", default=str(ROOT / "build" / "site"), help="output folder (replaced)")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    try:
        build_site(notebooks, Path(args.out))
    except SiteError as err:
        print(f"build_site: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One JupyterLab server and one headless Chromium for the whole browser-test session.

The fixtures here drive the curriculum the way a learner meets it: JupyterLab served on a
free localhost port with a random token, notebooks opened from temporary copies, cells run
from the Run menu, sliders moved with the keyboard. Everything the server writes (settings,
runtime files, IPython and matplotlib folders) lives in a temporary folder, so a learner's
own Jupyter set-up neither affects the tests nor is touched by them.

Fixtures:
  chromium_executable  path of Debian's real Chromium binary (skips, saying what to install;
                       fails instead when CI is set, since the Makefile installs it there)
  lab_server           the JupyterLab server (session); stopped with its kernels, also on failure.
                       Its copies of the notebooks are trusted, as `make lab`'s are, so stored
                       widget views draw (JupyterLab shows an untrusted one as plain text)
  browser              one Chromium and one context (session)
  lab                  a ``JupyterLabPage`` (one JupyterLab page shared by the tests, reloaded
                       after a failure); on failure it saves screenshots before/after, the
                       notebook's text and the server log to test-artifacts/browser/

Nothing here imports Playwright at module level: the GPU image has no Playwright, and the
test module skips through ``pytest.importorskip`` before any fixture runs.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = PROJECT_ROOT / "test-artifacts" / "browser"

INSTALL_HINT = (
    "install Chromium (Debian/Ubuntu: `apt-get install chromium`; elsewhere set "
    "INFERENCE_LAB_CHROMIUM=/path/to/chrome) and Playwright (`pip install playwright`, "
    "part of the dev extra; never `playwright install`)"
)

# Launch flags that keep a headless Chromium quiet and container-friendly (docs/architecture.md).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

# JupyterLab user settings: no news pop-up over the outputs, a kernel started without the
# "Select Kernel" dialog, no autosave writing into the copies, and every cell attached to the
# DOM (the default windowing leaves off-screen cells out of reach of selectors).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"autoStartDefaultKernel": True, "windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
}
# The learner's lab (scripts/lab.sh) keeps JupyterLab's autosave on, as a learner has it; only
# its interval is cut from 120 s to 2 s, so the test sees it write.
LEARNER_SETTINGS = dict(LAB_SETTINGS, **{
    "@jupyterlab/docmanager-extension/plugin": {"autosave": True, "autosaveInterval": 2},
})

SERVER_START_TIMEOUT_S = 90
KERNEL_START_TIMEOUT_S = 90


# --------------------------------------------------------------------------------------------
# Finding Chromium
# --------------------------------------------------------------------------------------------
def find_chromium() -> str | None:
    """Path of a Chromium binary, or None.

    Order: $INFERENCE_LAB_CHROMIUM; the real binary of Debian's ``chromium`` package (the
    ``chromium`` on PATH is a wrapper script that prints a harmless shell error); the usual
    location of that binary; ``chromium`` on PATH.
    """
    override = os.environ.get("INFERENCE_LAB_CHROMIUM")
    if override:
        return override if Path(override).is_file() else None
    if shutil.which("dpkg"):
        listing = subprocess.run(
            ["dpkg", "-L", "chromium"], capture_output=True, text=True, check=False
        ).stdout
        for line in listing.splitlines():
            if re.search(r"lib/chromium/chromium$", line) and Path(line).is_file():
                return line
    if Path("/usr/lib/chromium/chromium").is_file():
        return "/usr/lib/chromium/chromium"
    return shutil.which("chromium")


# --------------------------------------------------------------------------------------------
# Failure reports: fixtures read item.rep_call to know whether their test failed
# --------------------------------------------------------------------------------------------
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, "rep_" + report.when, report)
    return report


def _failed(node) -> bool:
    return any(
        getattr(node, "rep_" + when, None) is not None and getattr(node, "rep_" + when).failed
        for when in ("setup", "call")
    )


# --------------------------------------------------------------------------------------------
# The JupyterLab server
# --------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc; empty elsewhere).

    Kernels run in sessions of their own (jupyter_client starts them with a new session), so
    terminating the server's process group does not reach them: their ids are taken before
    shutdown and any survivor is ended by id.
    """
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        # Field 4 (ppid) follows the parenthesised command name, which may contain spaces.
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie has exited; only its parent's wait is missing
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


class LabServer:
    """A running ``jupyter lab`` with its temporary root, settings and token."""

    def __init__(self, base: Path):
        self.base = base
        self.root = base / "root"
        self.token = secrets.token_hex(24)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = base / "server.log"
        self.proc: subprocess.Popen | None = None
        self._copied: set[tuple[Path, bool]] = set()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        dirs = {}
        for var, sub in [
            ("JUPYTER_CONFIG_DIR", "config"),
            ("JUPYTER_DATA_DIR", "data"),
            ("JUPYTER_RUNTIME_DIR", "runtime"),
            ("JUPYTERLAB_SETTINGS_DIR", "settings"),
            ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
            ("IPYTHONDIR", "ipython"),
            ("MPLCONFIGDIR", "matplotlib"),
        ]:
            dirs[var] = str(self.base / sub)
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        for plugin, values in self.settings.items():
            path = self.base / "settings" / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))

        # The venv's jupyter; kernelspec "python3" resolves to this same interpreter (the
        # server replaces a kernelspec's bare "python" with its own sys.executable).
        bindir = Path(sys.executable).parent
        jupyter = bindir / "jupyter"
        env = dict(os.environ, **dirs, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
        # The fixture notebook asserts its kernel runs in this environment (sys.prefix).
        env["INFERENCE_LAB_TEST_PREFIX"] = sys.prefix
        env.pop("JUPYTER_TOKEN", None)
        cmd = self.command(jupyter, env)
        with open(self.log_path, "wb") as log:
            # A new session makes the server a process-group leader, so stop() can end the
            # whole group (the server and anything it spawned in that group).
            self.proc = subprocess.Popen(
                cmd, env=env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.api("GET", "/api/status", timeout=2)
                return
            except (OSError, urllib.error.URLError):
                time.sleep(0.2)
        raise RuntimeError(f"jupyter lab did not answer within {SERVER_START_TIMEOUT_S} s:\n{self.log_tail()}")

    settings = LAB_SETTINGS

    def command(self, jupyter: Path, env: dict) -> list[str]:
        return [
            str(jupyter) if jupyter.exists() else sys.executable,
            *([] if jupyter.exists() else ["-m", "jupyter"]),
            "lab",
            "--no-browser",
            "--allow-root",
            f"--port={self.port}",
            "--ServerApp.port_retries=0",
            "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.terminals_enabled=False",
        ]

    def stop(self) -> None:
        """POST /api/shutdown (which shuts its kernels down), then end whatever is left."""
        if self.proc is None:
            return
        spawned = _descendants(self.proc.pid)
        try:
            self.api("POST", "/api/shutdown", timeout=5)
        except (OSError, urllib.error.URLError):
            pass
        try:
            self.proc.wait(timeout=8)  # a clean shutdown takes ~1 s
        except subprocess.TimeoutExpired:
            for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        for sig in (signal.SIGTERM, signal.SIGKILL):
            survivors = [pid for pid in spawned if _alive(pid)]
            for pid in survivors:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            if survivors:
                time.sleep(1)
        self.proc = None

    # -- REST --------------------------------------------------------------------------------
    def api(self, method: str, path: str, timeout: float = 10):
        request = urllib.request.Request(
            f"{self.url}{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shutdown_sessions(self) -> None:
        """Delete every session, which shuts its kernel down (frees the models' memory)."""
        try:
            for session in self.api("GET", "/api/sessions"):
                self.api("DELETE", f"/api/sessions/{session['id']}", timeout=30)
        except (OSError, urllib.error.URLError):
            pass

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no server log)"

    # -- notebooks -----------------------------------------------------------------------------
    def copy_notebook(self, source: Path, trusted: bool = True) -> str:
        """Copy ``source``'s folder into the server root (once) and return the notebook's URL path.

        The whole folder travels so a notebook that reads or writes files next to itself
        finds them; the copy is what JupyterLab opens, so the originals are never modified.
        ``trusted``: signed in this server's notary, as scripts/learner_copy.py signs a
        learner's copies; an untrusted copy goes in a folder of its own.
        """
        source = source.resolve()
        folder = source.parent
        target = self.root / (folder.name if trusted else f"{folder.name}-untrusted")
        if (folder, trusted) not in self._copied:
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(
                folder, target,
                ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
            )
            self._copied.add((folder, trusted))
            for notebook in target.glob("*.ipynb"):
                self._mark(notebook, trusted)
        if not (target / source.name).exists():  # written after the folder was copied
            shutil.copy2(source, target / source.name)
            self._mark(target / source.name, trusted)
        return f"{target.name}/{source.name}"

    def _mark(self, notebook: Path, trusted: bool) -> None:
        """Trusted: signed in the notary of this server's Jupyter data folder. Untrusted: its
        content made to differ from the trusted copy's (trust goes by content)."""
        import nbformat
        from nbformat.sign import NotebookNotary

        nb = nbformat.read(notebook, as_version=nbformat.NO_CONVERT)
        if trusted:
            NotebookNotary(data_dir=str(self.base / "data")).sign(nb)
        else:
            nb.metadata["browser_test"] = "an untrusted copy"
            nbformat.write(nb, notebook)


class LearnerLabServer(LabServer):
    """JupyterLab started as `make lab` starts it: scripts/lab.sh, which makes the learner's copy.

    The copy goes to ``root`` (``INFERENCE_LAB_NOTEBOOKS``), the Jupyter folders and the token
    are this test's own, autosave is on (LEARNER_SETTINGS). Notebooks are opened where lab.sh
    put them, never copied by the test.
    """

    settings = LEARNER_SETTINGS

    def command(self, jupyter: Path, env: dict) -> list[str]:
        env.update(JUPYTER_TOKEN=self.token, INFERENCE_LAB_NOTEBOOKS=str(self.root))
        if os.geteuid() == 0:  # CI runs as root: opt in, as a learner would have to
            env["ALLOW_ROOT"] = "1"
        return [str(PROJECT_ROOT / "scripts" / "lab.sh"), f"--port={self.port}", "--no-browser",
                "--ServerApp.port_retries=0", "--ServerApp.terminals_enabled=False"]

    def copy_notebook(self, source: Path, trusted: bool = True) -> str:
        if not (self.root / source.name).is_file():
            raise AssertionError(f"lab.sh made no copy of {source.name} in {self.root}")
        return source.name


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    pytest.importorskip("playwright.sync_api", reason=f"playwright is not installed: {INSTALL_HINT}")
    path = find_chromium()
    if path is None:
        if os.environ.get("CI"):  # `make browser-test` installs it under CI: missing is a failure
            pytest.fail(f"CI is set but no Chromium binary was found: {INSTALL_HINT}")
        pytest.skip(f"no Chromium binary found: {INSTALL_HINT}")
    return path


@pytest.fixture(scope="session")
def lab_server(chromium_executable, tmp_path_factory):
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed: pip install -e '.[dev]'")
    pytest.importorskip("ipywidgets", reason="ipywidgets is not installed: pip install -e '.[dev]'")
    shutil.rmtree(ARTIFACTS, ignore_errors=True)  # stale screenshots of an earlier run
    server = LabServer(tmp_path_factory.mktemp("jupyterlab"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def browser(chromium_executable):
    """One Chromium and one browser context: its HTTP cache keeps JupyterLab's bundles warm."""
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(
            executable_path=chromium_executable, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium.new_context(viewport={"width": 1280, "height": 1000})
        finally:
            chromium.close()
    finally:
        playwright.stop()


@pytest.fixture(scope="session")
def _shared_page():
    holder = {}
    yield holder
    if holder.get("lab_page") is not None:
        holder["lab_page"].page.close()


@pytest.fixture
def lab(request, browser, lab_server, _shared_page):
    """The JupyterLab page, shared by the tests; screenshots kept on failure.

    Loading JupyterLab costs ~4 s of the 2-core machine; opening a notebook inside a loaded
    JupyterLab (File > Open from Path) ~1 s. After each test its tab is closed (changes
    discarded: the copy is thrown away anyway) and its kernel shut down. After a failure,
    or a tab that does not close cleanly, the page is dropped and the next test loads a
    fresh JupyterLab, so nothing a failed test left behind reaches the next one.
    """
    lab_page = _shared_page.get("lab_page")
    if lab_page is None:
        page = browser.new_page()
        page.set_default_timeout(30_000)
        lab_page = _shared_page["lab_page"] = JupyterLabPage(page, lab_server)
    clean = False
    try:
        yield lab_page
        clean = not _failed(request.node)
    finally:
        try:
            if _failed(request.node):
                lab_page.save_artifacts(request.node.name)
            lab_page.settle()
            clean = clean and lab_page.close_notebook()
        finally:
            if not clean:
                lab_page.page.close()
                _shared_page["lab_page"] = None
            lab_server.shutdown_sessions()


@pytest.fixture
def learner_lab(request, browser, chromium_executable, tmp_path_factory):
    """A JupyterLab page on a server started by scripts/lab.sh (the learner's copy, autosave on)."""
    pytest.importorskip("jupyterlab", reason="jupyterlab is not installed: pip install -e '.[dev]'")
    server = LearnerLabServer(tmp_path_factory.mktemp("learner-lab"))
    page = None
    try:
        server.start()
        page = browser.new_page()
        page.set_default_timeout(30_000)
        lab_page = JupyterLabPage(page, server)
        yield lab_page
        if _failed(request.node):
            lab_page.save_artifacts(request.node.name)
        lab_page.settle()
    finally:
        if page is not None:
            page.close()
        server.stop()


# --------------------------------------------------------------------------------------------
# Driving JupyterLab
# --------------------------------------------------------------------------------------------
# In the DOM, JupyterLab renders an error output exactly like text on stderr (both carry
# data-mime-type="application/vnd.jupyter.stderr"), so an error is recognised by what it
# shows: a traceback, or a last line naming an exception (a SyntaxError has no traceback
# header). A widget that failed to render shows "Error displaying widget". Warnings and
# progress text on stderr are not errors.
_JS_HELPERS = r"""
const notebookOf = () => document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
const cellIndex = (el) => {
  const cell = el.closest('.jp-Cell');
  return cell ? [...cell.parentElement.children].filter(c => c.classList.contains('jp-Cell')).indexOf(cell) : -1;
};
const errorOutputs = () => {
  const nb = notebookOf();
  if (!nb) return [];
  const found = [];
  for (const el of nb.querySelectorAll('.jp-OutputArea-output')) {
    const mime = el.getAttribute('data-mime-type') || '';
    const text = (el.innerText || '').trim();
    const lines = text.split('\n').filter(l => l.trim());
    const last = lines.length ? lines[lines.length - 1].trim() : '';
    const traceback = mime === 'application/vnd.jupyter.error' || (
      mime === 'application/vnd.jupyter.stderr' && (
        /Traceback \(most recent call last\)/.test(text) ||
        /^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b(:.*)?$/.test(last)));
    if (traceback || /Error displaying widget/.test(text)) {
      found.push({cell: cellIndex(el), text: text.slice(-600)});
    }
  }
  return found;
};
const codeCells = () => {
  const nb = notebookOf();
  if (!nb) return [];
  return [...nb.querySelectorAll('.jp-CodeCell')].map(cell => ({
    index: cellIndex(cell),
    prompt: (cell.querySelector('.jp-InputArea-prompt')?.textContent || '').trim(),
    // run-all leaves an empty code cell without an execution count
    empty: !(cell.querySelector('.jp-InputArea-editor')?.textContent || '').trim(),
  }));
};
const kernelStatus = () => {
  const item = [...document.querySelectorAll('#jp-main-statusbar .jp-StatusBar-TextItem')]
    .find(el => (el.getAttribute('title') || '').startsWith('Change kernel'));
  return item ? item.textContent.trim() : '';
};
const kernelIdle = () => /\|\s*Idle$/.test(kernelStatus());
// A stored widget view is drawn (an output holding a .jupyter-widgets element), or
// shown as its plain-text stand-in ("VBox(children=(HTML(value=..."): JupyterLab's choice for a
// notebook it does not trust, or for a view whose state it cannot find.
const WIDGET_REPR = /^(VBox|HBox|Box|GridBox|Output|HTML|HTMLMath|Label|Button|ToggleButtons?|Dropdown|Text|Textarea|Checkbox|\w*Slider|\w*Text|Tab|Accordion|Play)\(/;
const widgetViews = () => {
  const nb = notebookOf();
  if (!nb) return {drawn: 0, plain: []};
  // an output area's own outputs, not those drawn inside a widget (an Output widget's figure)
  const outputs = [...nb.querySelectorAll('.jp-OutputArea-output')].filter(el => !el.parentElement.closest('.jupyter-widgets'));
  const drawn = outputs.filter(el => el.querySelector(':scope > .jupyter-widgets')).length;
  const plain = [...nb.querySelectorAll('.jp-OutputArea-output[data-mime-type="text/plain"]')]
    .map(el => (el.innerText || '').trim()).filter(t => WIDGET_REPR.test(t)).map(t => t.slice(0, 80));
  return {drawn, plain};
};
"""


def _js(body: str) -> str:
    """A function expression for page.evaluate / wait_for_function with the helpers in scope."""
    return f"(arg) => {{ {_JS_HELPERS}\n {body} }}"


SLIDER_LABEL = re.compile(r"^\s*(batch size|prompt length)\s*:?\s*$", re.IGNORECASE)


class JupyterLabPage:
    """One JupyterLab tab: open a notebook, run it from the menu, find and move its widgets."""

    def __init__(self, page, server: LabServer):
        self.page = page
        self.server = server
        self.before_png: bytes | None = None
        self.notebook: str | None = None
        self.app_loaded = False

    # -- opening and running ---------------------------------------------------------------
    def open(self, source: Path, wait_for_kernel: bool = True, trusted: bool = True) -> None:
        """Open a temporary copy of ``source`` in JupyterLab (``trusted``: see copy_notebook).

        A fresh page loads ``/lab/tree/<copy>?reset`` (``?reset``: no stale workspace); a page
        where JupyterLab is already loaded opens it from the File menu, as a learner would.
        """
        self.notebook = self.server.copy_notebook(source, trusted=trusted)
        self.before_png = None
        if self.app_loaded:
            self.menu("File", "filebrowser:open-path")
            path_input = self.page.locator(".jp-Dialog input")
            path_input.fill(self.notebook)
            path_input.press("Enter")
        else:
            self.page.goto(f"{self.server.url}/lab/tree/{self.notebook}?reset&token={self.server.token}")
            self.app_loaded = True
        self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell").first.wait_for(state="visible")
        if wait_for_kernel:
            self.wait_kernel_idle(KERNEL_START_TIMEOUT_S)
        self.before_png = self.page.screenshot()

    def wait_kernel_idle(self, timeout_s: float) -> None:
        """The status bar says "Python 3 (ipykernel) | Idle" (the toolbar indicator says idle too early)."""
        try:
            self.page.wait_for_function(_js("return kernelIdle();"), polling=200, timeout=timeout_s * 1000)
        except Exception as exc:
            raise AssertionError(
                f"kernel of {self.notebook} not idle after {timeout_s} s "
                f"(status bar: {self.kernel_status()!r})"
            ) from exc

    def settle(self, timeout_s: float = 30) -> None:
        """Wait until the kernel has started (or is gone), so deleting its session is clean.

        A session deleted while its kernel is still starting leaves the server busy at
        shutdown; a kernel busy running cells (a failed test) is fine to delete.
        """
        if self.notebook is None:
            return
        try:
            self.page.wait_for_function(
                _js("return /\\|\\s*(Idle|Busy|Dead)$/.test(kernelStatus());"),
                polling=200, timeout=timeout_s * 1000,
            )
        except Exception:
            pass  # teardown goes on: the server's shutdown still ends the kernel

    def close_notebook(self) -> bool:
        """Close the notebook's tab (File > Close Tab, "Discard" if asked to save).

        Returns False if it did not close cleanly; the caller then drops the page.
        """
        if self.notebook is None:
            return True
        try:
            self.menu("File", "application:close")
            panels = self.page.locator(".jp-NotebookPanel")
            discard = self.page.locator(".jp-Dialog .jp-Dialog-button", has_text=re.compile(r"^\s*Discard\s*$"))
            deadline = time.monotonic() + 10
            while panels.count() and time.monotonic() < deadline:
                if discard.count():
                    discard.first.click()
                self.page.wait_for_timeout(100)
            if panels.count() or self.page.locator(".jp-Dialog").count():
                return False
        except Exception:
            return False
        self.notebook = None
        return True

    def kernel_status(self) -> str:
        return self.page.evaluate(_js("return kernelStatus();"))

    def menu(self, menu: str, command: str) -> None:
        """Click a top menu, then the item carrying ``data-command=command``."""
        self.page.locator(".lm-MenuBar-item", has_text=re.compile(rf"^{menu}$")).click()
        self.page.locator(f'li.lm-Menu-item[data-command="{command}"]').click()

    def run_all(self, timeout_s: float = 150) -> float:
        """Clear all outputs, run all cells from the Run menu, wait until every cell ran.

        Clearing first means no stored execution count can pass for a new one. Finished
        means: no cell queued or running ("[*]"), the kernel idle, and every non-empty code
        cell numbered, or an error shown (run-all stops at the first error). Returns seconds.
        """
        self.menu("Edit", "editmenu:clear-all")
        self.page.wait_for_function(
            _js("return codeCells().every(c => !/\\d/.test(c.prompt));"), polling=100, timeout=10_000
        )
        start = time.monotonic()
        self.menu("Run", "runmenu:run-all")
        try:
            self.page.wait_for_function(
                _js(
                    "const cells = codeCells();"
                    "if (!cells.length || cells.some(c => c.prompt.includes('*'))) return false;"
                    "const done = cells.every(c => c.empty || /\\[\\d+\\]/.test(c.prompt));"
                    "return (done || errorOutputs().length > 0) && kernelIdle();"
                ),
                polling=250,
                timeout=timeout_s * 1000,
            )
        except Exception as exc:
            pending = [c["index"] for c in self.code_cells() if not re.search(r"\[\d+\]", c["prompt"])]
            raise AssertionError(
                f"{self.notebook}: run-all not finished after {timeout_s} s; cells without an "
                f"execution count: {pending}; kernel: {self.kernel_status()!r}"
            ) from exc
        return time.monotonic() - start

    def code_cells(self) -> list[dict]:
        return self.page.evaluate(_js("return codeCells();"))

    def unexecuted_cells(self) -> list[int]:
        """Indices of non-empty code cells without an execution count."""
        return [
            c["index"] for c in self.code_cells()
            if not c["empty"] and not re.search(r"\[\d+\]", c["prompt"])
        ]

    def error_outputs(self) -> list[dict]:
        """[{cell, text}] for every output showing a traceback or a widget that failed."""
        return self.page.evaluate(_js("return errorOutputs();"))

    def rendered_figures(self, timeout_s: float = 30) -> int:
        """Number of output <img>s that decoded (naturalWidth > 0).

        Outputs are in the DOM with their cells; if no <img> shows up within a few seconds
        there is none stored, and the caller's assert says so without a long wait.
        """
        images = _js("const nb = notebookOf(); return nb ? nb.querySelectorAll('.jp-OutputArea-output img').length : 0;")
        decoded = _js(
            "const nb = notebookOf(); if (!nb) return 0;"
            "return [...nb.querySelectorAll('.jp-OutputArea-output img')]"
            ".filter(img => img.complete && img.naturalWidth > 0).length;"
        )
        try:
            self.page.wait_for_function(images, polling=200, timeout=5_000)
            self.page.wait_for_function(decoded, polling=200, timeout=timeout_s * 1000)
        except Exception:
            pass  # the caller asserts on the count and says what was missing
        return self.page.evaluate(decoded)

    def widget_views(self, expected: int = 0, timeout_s: float = 30) -> dict:
        """{drawn, plain}: stored widget views drawn, and those shown as plain text.

        Waits up to ``timeout_s`` for ``expected`` views to be drawn (JupyterLab restores a
        notebook's widget state once its kernel session is ready) or any shown as plain text
        (JupyterLab chooses that when it renders the output, for good), then reports what it sees.
        """
        if expected:
            try:
                self.page.wait_for_function(
                    _js("const v = widgetViews(); return v.drawn >= arg || v.plain.length > 0;"),
                    arg=expected, polling=200,
                    timeout=timeout_s * 1000,
                )
            except Exception:
                pass  # the caller asserts on the counts and says what was missing
        return self.page.evaluate(_js("return widgetViews();"))

    # -- the widget dashboard ----------------------------------------------------------------
    def dashboard(self, timeout_s: float = 30) -> "Dashboard":
        """The first slider described "batch size" or "prompt length", with its cell.

        The chosen slider and its code cell get ``data-browser-test`` attributes so later
        locators find exactly them.
        """
        mark_js = _js(
            "const nb = notebookOf(); if (!nb) return null;"
            "const re = new RegExp(arg, 'i');"
            "document.querySelectorAll('[data-browser-test]').forEach(el => el.removeAttribute('data-browser-test'));"
            "for (const slider of nb.querySelectorAll('.widget-slider')) {"
            "  const label = slider.querySelector('.widget-label');"
            "  if (!label || !re.test(label.textContent)) continue;"
            "  const cell = slider.closest('.jp-CodeCell');"
            "  slider.setAttribute('data-browser-test', 'dashboard-slider');"
            "  cell.setAttribute('data-browser-test', 'dashboard-cell');"
            "  return label.textContent.trim();"
            "}"
            "return null;"
        )
        try:
            handle = self.page.wait_for_function(
                mark_js, arg=SLIDER_LABEL.pattern, polling=200, timeout=timeout_s * 1000
            )
        except Exception as exc:
            labels = self.page.evaluate(
                "() => [...document.querySelectorAll('.widget-slider .widget-label')].map(l => l.textContent)"
            )
            raise AssertionError(
                f"{self.notebook}: no slider described 'batch size' or 'prompt length' rendered "
                f"within {timeout_s} s (slider labels seen: {labels})"
            ) from exc
        return Dashboard(self, handle.json_value())

    # -- failure artifacts -------------------------------------------------------------------
    def save_artifacts(self, test_name: str) -> None:
        """Screenshots before (on open) and after (now), the page's notebook text, the server log."""
        if self.notebook is None:  # failed before opening anything (e.g. a missing notebook)
            return
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        stem = re.sub(r"[^\w.-]+", "_", test_name)
        if self.before_png is not None:
            (ARTIFACTS / f"{stem}-before.png").write_bytes(self.before_png)
        try:
            self.page.screenshot(path=str(ARTIFACTS / f"{stem}-after.png"))
            text = self.page.evaluate(_js("const nb = notebookOf(); return nb ? nb.innerText : document.body.innerText;"))
            (ARTIFACTS / f"{stem}-page.txt").write_text(text)
        except Exception as exc:  # a crashed page: keep what we have
            (ARTIFACTS / f"{stem}-page.txt").write_text(f"could not read the page: {exc}")
        (ARTIFACTS / "server.log").write_text(self.server.log_tail(200_000))


class Dashboard:
    """A slider, the ``inference-lab-readout`` text and the widget figure of one cell."""

    def __init__(self, lab_page: JupyterLabPage, label: str):
        self.lab = lab_page
        self.page = lab_page.page
        self.label = label
        self.slider = self.page.locator('[data-browser-test="dashboard-slider"]')

    def state(self) -> dict:
        """Slider value, readout texts and the figure: what a learner sees right now.

        The readout is looked for in the dashboard's cell first, then anywhere in the notebook.
        """
        return self.page.evaluate(
            """() => {
              const cell = document.querySelector('[data-browser-test="dashboard-cell"]');
              const slider = document.querySelector('[data-browser-test="dashboard-slider"]');
              let readouts = cell ? [...cell.querySelectorAll('.inference-lab-readout')] : [];
              if (!readouts.length) readouts = [...document.querySelectorAll('.jp-Notebook .inference-lab-readout')];
              const imgs = cell ? [...cell.querySelectorAll('.widget-output img')] : [];
              return {
                value: (slider?.querySelector('.widget-readout')?.textContent || '').trim(),
                readout: readouts.map(r => (r.innerText || '').trim()).join(' | '),
                readout_visible: readouts.some(r => r.offsetParent !== null && (r.innerText || '').trim()),
                figure: imgs.map(i => i.getAttribute('src') || '').join('|'),
                figures_decoded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
              };
            }"""
        )

    def move_slider(self) -> tuple[str, str]:
        """Press ArrowRight on the slider's handle (ArrowLeft if it is at its maximum).

        Returns (old value, new value) as shown in the slider's own ``.widget-readout``.
        """
        handle = self.slider.locator(".noUi-handle").first
        value_box = self.slider.locator(".widget-readout").first
        old = value_box.inner_text().strip()
        for key in ("ArrowRight", "ArrowLeft"):
            handle.focus()
            handle.press(key)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                new = value_box.inner_text().strip()
                if new != old:
                    return old, new
                self.page.wait_for_timeout(100)
        raise AssertionError(f"slider {self.label!r} did not move from {old!r} with the arrow keys")

    def wait_redrawn(self, before: dict, new_value: str, timeout_s: float = 60) -> dict:
        """Wait until the figure's <img> changed and the readout shows ``new_value``."""
        try:
            self.page.wait_for_function(
                """([oldFigure, oldReadout, value]) => {
                  const cell = document.querySelector('[data-browser-test="dashboard-cell"]');
                  if (!cell) return false;
                  const imgs = [...cell.querySelectorAll('.widget-output img')];
                  const figure = imgs.map(i => i.getAttribute('src') || '').join('|');
                  if (!imgs.length || figure === oldFigure) return false;
                  if (!imgs.every(i => i.complete && i.naturalWidth > 0)) return false;
                  let readouts = [...cell.querySelectorAll('.inference-lab-readout')];
                  if (!readouts.length) readouts = [...document.querySelectorAll('.jp-Notebook .inference-lab-readout')];
                  // "1,024" and "1 024" read as 1024; the value must stand alone, not inside 8.5 or 128
                  const norm = s => s.replace(/(\\d)[,\\u00a0\\u202f _](?=\\d{3}\\b)/g, '$1');
                  const v = norm(value).replace(/[.*+?^${}()|[\\]\\\\]/g, '\\\\$&');
                  const re = new RegExp('(?<![\\\\d.])' + v + '(?!\\\\.?\\\\d)');
                  const text = readouts.map(r => (r.innerText || '').trim()).join(' | ');
                  return text !== oldReadout && re.test(norm(text));
                }""",
                arg=[before["figure"], before["readout"], new_value],
                polling=100,
                timeout=timeout_s * 1000,
            )
        except Exception as exc:
            now = self.state()
            raise AssertionError(
                f"{self.lab.notebook}: after moving {self.label!r} to {new_value!r}, within "
                f"{timeout_s} s: figure changed={now['figure'] != before['figure']} "
                f"({now['figures_decoded']} decoded img); readout was {before['readout']!r}, "
                f"is {now['readout']!r} (must change and contain {new_value!r})"
            ) from exc
        return self.state()

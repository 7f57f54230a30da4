"""The foundation: packaging stays in sync, the kernel mode is decided in one place, and
the two README commands behave on a fresh machine."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.strip()
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[_name(name)] = version.split(";")[0].strip()   # drop an environment marker
    return pins


def _project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _constraints() -> dict[str, str]:
    return _pins((ROOT / "constraints.txt").read_text().splitlines())


def test_constraints_pin_every_dependency():
    project = _project()
    constraints = _constraints()
    wanted = {_name(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]}
    unpinned = sorted(wanted - set(constraints))
    assert not unpinned, f"constraints.txt has no exact pin for {unpinned}"
    # The GPU machine's stack, exactly.
    assert (constraints["jax"], constraints["jaxlib"], constraints["flax"]) == ("0.11.2", "0.11.2", "0.12.10")


def test_environment_yml_is_the_learner_stack_through_the_constraints():
    yaml = pytest.importorskip("yaml")
    project = _project()
    runtime = {_name(r) for r in project["dependencies"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    python = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")]
    assert python == ["python=3.12"], "environment.yml must pin python=3.12"
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "-c constraints.txt" in pip_section, "environment.yml must install through constraints.txt (-c)"
    assert "-e ." in pip_section, "environment.yml must install this project (-e .)"
    env_pins = _pins(pip_section)
    missing, extra = runtime - set(env_pins), set(env_pins) - runtime
    assert not missing, f"a dependency of pyproject.toml that environment.yml does not list: {sorted(missing)}"
    assert not extra, f"environment.yml lists what the learner's install does not need: {sorted(extra)}"
    constraints = _constraints()
    drift = {n: (v, constraints.get(n)) for n, v in env_pins.items() if constraints.get(n) != v}
    assert not drift, f"environment.yml and constraints.txt disagree (name: (yml, constraints)): {drift}"


def test_cuda_extras_match_pinned_jax():
    project = _project()
    extras = project["optional-dependencies"]
    assert project["requires-python"] == ">=3.12"
    for flavour in ("cuda12", "cuda13"):
        (req,) = extras[flavour]
        assert req.startswith(f"jax[{flavour}]") and "0.11.2" in req


@pytest.mark.parametrize("flavour", ["cuda12", "cuda13"])
def test_constraints_pin_the_cuda_wheels_at_the_jax_version(flavour):
    """What jax[FLAVOUR] asks for (read from the installed jax's metadata) is pinned, inside
    jax's own range; so are the plugin's PJRT wheel and the NVIDIA wheels it pulls in
    (resolved by scripts/check_cuda_pins.py, which needs the registry)."""
    from importlib.metadata import requires, version

    from packaging.requirements import Requirement

    constraints = _constraints()
    jax_version = constraints["jax"]
    assert version("jax") == jax_version, "the installed jax is not the pinned one: make setup"
    asked = [Requirement(r) for r in requires("jax") or []]
    asked = [r for r in asked if r.marker is not None and r.marker.evaluate({"extra": flavour})]
    assert any(r.name == f"jax-{flavour}-plugin" for r in asked), f"jax {jax_version} has no {flavour} extra"
    for req in asked:
        pin = constraints.get(_name(req.name))
        assert pin is not None, f"constraints.txt does not pin {req.name} (from jax[{flavour}])"
        assert req.specifier.contains(pin, prereleases=True), f"{req.name}=={pin} is outside jax's {req.specifier}"
    assert constraints.get(f"jax-{flavour}-pjrt") == jax_version
    cublas = {"cuda12": "nvidia-cublas-cu12", "cuda13": "nvidia-cublas"}[flavour]
    assert cublas in constraints, \
        f"constraints.txt pins no NVIDIA wheels of {flavour} (scripts/check_cuda_pins.py --unpinned)"


def _make_n(target: str, accel: str) -> str:
    out = subprocess.run(["make", "-n", "-B", target, f"ACCEL={accel}"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("accel", ["cpu", "cuda12"])
def test_lab_installs_no_test_tools_and_test_does(accel):
    """`make lab` installs the project (and the CUDA plugin); `make test` adds the dev extra."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    lab = [line for line in _make_n("lab", accel).splitlines() if "pip install" in line]
    test = [line for line in _make_n("setup-dev", accel).splitlines() if "pip install" in line]
    cuda = f"[{accel}]" if accel != "cpu" else ""
    assert len(lab) == 1 and "-c constraints.txt" in lab[0] and f'-e ".{cuda}"' in lab[0], lab
    assert len(test) == 1 and "-c constraints.txt" in test[0], test
    assert "[dev" in test[0] and (accel == "cpu" or accel in test[0]), test


def test_auto_mode_on_this_machine(monkeypatch):
    from pallas_kernels import mode

    monkeypatch.delenv(mode.ENV_VAR, raising=False)
    if mode.pallas_supported():
        assert mode.resolve_mode("auto") == "pallas"
    else:
        assert mode.resolve_mode("auto") == "reference"
        with pytest.raises(ValueError, match="mode='pallas' cannot run here.*interpret"):
            mode.resolve_mode("pallas")
    assert mode.resolve_mode("interpret") == "interpret"
    assert mode.resolve_mode("REFERENCE") == "reference"
    line = mode.describe()
    assert "\n" not in line and '"auto" runs' in line


def test_mode_override_and_bad_names(monkeypatch):
    from pallas_kernels import mode

    monkeypatch.setenv(mode.ENV_VAR, "interpret")
    assert mode.resolve_mode("auto") == "interpret"
    assert mode.ENV_VAR in mode.describe()
    assert mode.resolve_mode("reference") == "reference"  # an explicit mode wins
    monkeypatch.setenv(mode.ENV_VAR, "fast")
    with pytest.raises(ValueError, match="PALLAS_KERNELS_MODE='fast'"):
        mode.resolve_mode("auto")
    monkeypatch.delenv(mode.ENV_VAR)
    with pytest.raises(ValueError, match="mode='cuda' is not a kernel mode"):
        mode.resolve_mode("cuda")


def test_env_command():
    out = subprocess.run([sys.executable, "-m", "inference_lab", "env"], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for key in ("python", "jax", "jaxlib", "flax", "devices", "kernels", "matplotlib", "ipywidgets"):
        assert re.search(rf"^{key}\s", out.stdout, re.M), f"`env` lacks a {key} line:\n{out.stdout}"
    assert '"auto" runs' in out.stdout


def test_setup_rejects_an_old_python():
    if shutil.which("python3.11") is None:
        pytest.skip("no python3.11 on PATH to demonstrate the rejection with")
    out = subprocess.run(["make", "setup", "PYTHON=python3.11"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode != 0
    assert "needs Python >= 3.12" in out.stderr and "PYTHON=" in out.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lab_settings():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import lab_settings
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return lab_settings


def test_lab_defaults_go_where_this_jupyterlab_reads_them(tmp_path):
    """`make setup` writes the lab's JupyterLab defaults into the environment's app settings
    folder (not the learner's home), in the package-owned overrides.d/ form."""
    pytest.importorskip("jupyterlab")
    from jupyterlab.labapp import LabApp

    lab_settings = _lab_settings()
    assert lab_settings.default_settings_dir() == Path(LabApp().app_settings_dir)
    assert str(lab_settings.default_settings_dir()).startswith(sys.prefix)
    path = lab_settings.install(tmp_path)
    assert path == tmp_path / "overrides.d" / "inference-lab.json"
    assert '"fetchNews": "false"' in path.read_text()
    before = path.stat().st_mtime_ns
    lab_settings.install(tmp_path)  # a rerun changes nothing
    assert path.stat().st_mtime_ns == before


def test_lab_command_serves_with_authentication(tmp_path):
    """lab.sh: localhost, a token always (even over a config that sets none), the lab's
    defaults (no Jupyter-news question), and the learner's copy of the lessons as its root."""
    pytest.importorskip("jupyterlab")
    app_settings = tmp_path / "app-settings"
    _lab_settings().install(app_settings)
    port = _free_port()
    env = dict(os.environ)
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR",
                "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR", "IPYTHONDIR"):
        env[var] = str(tmp_path / var.lower())
    env.pop("JUPYTER_TOKEN", None)
    env["INFERENCE_LAB_NOTEBOOKS"] = str(tmp_path / "my-notebooks")
    # A learner's own config that turns the token off (issue 25): lab.sh's explicit token wins.
    config = tmp_path / "jupyter_config_dir"
    config.mkdir()
    (config / "jupyter_server_config.py").write_text('c.IdentityProvider.token = ""\nc.ServerApp.token = ""\n')
    if os.geteuid() == 0:  # CI runs as root: opt in, as a learner would have to
        env["ALLOW_ROOT"] = "1"
    server = subprocess.Popen(
        [str(ROOT / "scripts" / "lab.sh"), "--no-browser", f"--port={port}", "--ServerApp.port_retries=0",
         f"--LabApp.app_settings_dir={app_settings}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        status = None
        deadline = time.time() + 60
        while time.time() < deadline and server.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=2)
                status = 200
            except urllib.error.HTTPError as e:
                status = e.code
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.3)
                continue
            break
        assert status is not None, f"JupyterLab did not answer on port {port}"
        assert status == 403, f"the API answered {status} without a token: the server is open"
        # The token is in the server's runtime file; with it, read what JupyterLab will use.
        (info,) = (tmp_path / "jupyter_runtime_dir").glob("jpserver-*.json")
        token = json.loads(info.read_text())["token"]
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/lab/api/settings/@jupyterlab/apputils-extension:notification",
            headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            schema = json.loads(response.read())["schema"]  # overrides become the schema's defaults
        default = schema["properties"]["fetchNews"]["default"]
        assert default == "false", f"JupyterLab would ask about Jupyter news (fetchNews={default!r})"
        # The file browser shows the learner's copy, not the tracked notebooks/ (issue 26).
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/contents",
                                         headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            served = sorted(item["name"] for item in json.loads(response.read())["content"])
        shipped = sorted(p.name for p in (ROOT / "notebooks").iterdir() if not p.name.startswith("."))
        assert served == shipped, served
        assert (tmp_path / "my-notebooks" / "05_batching.ipynb").is_file()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            out, _ = server.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            out, _ = server.communicate()
    assert "127.0.0.1" in out and "token=" in out, "the server should print its tokened localhost URL"


def test_lab_refuses_root_unless_asked(tmp_path):
    """lab.sh run by root (an `id` on PATH says uid 0, whoever runs the test) without
    ALLOW_ROOT: one line saying why and how to opt in; JupyterLab is never started."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").write_text("#!/bin/sh\necho 0\n")
    (bin_dir / "id").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "ALLOW_ROOT"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    out = subprocess.run(["bash", str(ROOT / "scripts" / "lab.sh"), "--version"], capture_output=True, text=True,
                         timeout=30, cwd=ROOT, env=env)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "refusing to start JupyterLab as root" in out.stderr
    assert "ALLOW_ROOT=1 make lab" in out.stderr


def test_make_lab_passes_allow_root_through():
    """`ALLOW_ROOT=1 make lab` and `make lab ALLOW_ROOT=1` both reach lab.sh (a dry run)."""
    # Not the settings of a `make test` this may run under (MAKEFLAGS carries its variables).
    clean = {k: v for k, v in os.environ.items() if k not in ("ALLOW_ROOT", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    for args, env in ((["ALLOW_ROOT=1"], {}), ([], {"ALLOW_ROOT": "1"}), ([], {})):
        out = subprocess.run(["make", "-n", "lab", *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                             env=dict(clean, **env))
        want = 'ALLOW_ROOT="1" scripts/lab.sh' if args or env else 'ALLOW_ROOT="" scripts/lab.sh'
        assert want in out.stdout, out.stdout + out.stderr


def test_make_lab_as_root_refuses_before_installing(tmp_path):
    """Issue 26: as root without ALLOW_ROOT=1, `make lab` stops at once, before the set-up."""
    if os.geteuid() != 0:
        pytest.skip("the refusal is for root")
    env = {k: v for k, v in os.environ.items() if k != "ALLOW_ROOT"}
    started = time.time()
    done = subprocess.run(["make", "-s", "lab", f"VENV={tmp_path / 'never'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "refusing to start JupyterLab as root" in done.stderr
    assert time.time() - started < 10 and not (tmp_path / "never").exists()     # nothing was installed


def test_make_site_without_the_lab_installs_only_what_the_site_needs(tmp_path):
    """Issue 26: "read it without installing anything: make site" set up the 1.1 GB lab first.
    Without a lab environment it makes .venv-site with nbconvert and BeautifulSoup alone; with
    one, it uses that (a dry run of each)."""
    for name in ("Makefile", "constraints.txt", "pyproject.toml"):
        shutil.copy2(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    clean = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    fresh = subprocess.run(["make", "-n", "site"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=clean)
    assert fresh.returncode == 0, fresh.stderr
    assert "-m pip install -q --disable-pip-version-check -c constraints.txt nbconvert beautifulsoup4" in fresh.stdout
    assert ".venv-site/bin/python scripts/build_site.py --out build/site" in fresh.stdout
    assert "jax" not in fresh.stdout and ".venv/bin/python" not in fresh.stdout
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / ".installed-cpu").write_text("")
    lab = subprocess.run(["make", "-n", "site"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=clean)
    assert ".venv/bin/python scripts/build_site.py" in lab.stdout and "pip install" not in lab.stdout, lab.stdout

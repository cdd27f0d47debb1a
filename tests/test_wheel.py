"""The wheel stands alone: built with ``pip wheel``, installed into a new venv outside the
checkout, its ``fleetpulse`` command runs the demo.

What this proves and what it does not: every fleetpulse file the commands use comes from the
wheel (the venv's site-packages, checked module by module; the checkout is never on the
path, the commands run from an empty folder). The third-party dependencies are the test
environment's own, reached through a ``.pth`` line, not downloaded again: that keeps the
test to a couple of minutes and offline after the build, and ``test_imports.py`` checks
separately that every import is a declared dependency.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from fleetpulse.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "fleetpulse", "agent", "aggregator", "detector", "benchmarks")
# What a build needs; tests/ and docs/ are left out to show the wheel needs neither.
_NOT_COPIED = shutil.ignore_patterns(
    ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
    ".mypy_cache", ".ruff_cache", ".hypothesis", ".cache", "tests", "docs", "*.nbi", "*.nbc")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float
         ) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, f"{cmd} exited {res.returncode}:\n{res.stderr[-4000:]}"
    return res


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel`` of a copy of the working tree (a build in the checkout itself would
    reuse ``build/lib``, where setuptools leaves files that no longer exist)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=_NOT_COPIED)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
          "--no-deps", "-w", str(tmp / "dist"), str(src)], tmp, dict(os.environ), 300)
    (found,) = (tmp / "dist").glob("fleetpulse-*.whl")
    return found


def test_wheel_carries_the_page_the_configs_and_the_deploy_files(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for asset in ("index.html", "app.js", "app.css"):
        assert f"fleetpulse/web/{asset}" in names, asset
    data = next(n.split("/data/", 1)[0] for n in names if ".data/data/" in n) + "/data/"
    for folder, pattern in (("config", "*.toml"), ("deploy", "*.service"),
                            ("deploy", "*.yaml")):
        for path in (ROOT / folder).glob(pattern):
            assert f"{data}share/fleetpulse/{folder}/{path.name}" in names, path.name
    for pkg in PACKAGES:
        assert f"{pkg}/__init__.py" in names, pkg
    assert not [n for n in names if n.startswith("tests/")]
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "fleetpulse = fleetpulse.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_wheel_in_a_new_venv_runs_help_and_the_demo(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path,
         dict(os.environ), 120)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
          "--disable-pip-version-check", "--no-deps", "--no-index", str(wheel)],
         tmp_path, dict(os.environ), 300)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                      "['purelib'])"], tmp_path, dict(os.environ), 60).stdout.strip())
    # Third-party dependencies only: a path line in a .pth does not run that folder's own
    # .pth files, so the checkout's editable-install hook stays inert.
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "zz_test_dependencies.pth").write_text("".join(f"{p}\n" for p in deps))

    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP"}}
    env |= {"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONNOUSERSITE": "1", "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}

    probe = ("import importlib, json, sys\n"
             f"files = {{p: importlib.import_module(p).__file__ for p in {PACKAGES!r}}}\n"
             "print(json.dumps({'path': sys.path, 'files': files}))\n")
    where = _run([str(python), "-c", probe], run_dir, env, 120)
    found = json.loads(where.stdout)
    for pkg, file in found["files"].items():
        assert Path(file).is_relative_to(site), f"{pkg} imported from {file}, not the wheel"
    assert not [p for p in found["path"] if p and Path(p).resolve() == ROOT]
    assert (venv / "share" / "fleetpulse" / "config" / "demo.toml").read_bytes() == (
        ROOT / "config" / "demo.toml").read_bytes()

    helped = _run([str(venv / "bin" / "fleetpulse"), "--help"], run_dir, env, 120)
    for command in COMMANDS:
        assert command in helped.stdout, command

    # Port 0: the demo's default 8080 may be taken on a shared machine; nothing else differs.
    demo = _run([str(venv / "bin" / "fleetpulse"), "demo", "--duration", "20", "--json",
                 "--listen", "127.0.0.1:0"], run_dir, env, 840)
    summary = json.loads(demo.stdout.strip().splitlines()[-1])
    assert summary["gpus"] == 1024 and summary["samples"] > 0
    assert summary["aggregated_metrics"] > 0
    assert "heatmap and query API on http://127.0.0.1:" in demo.stderr

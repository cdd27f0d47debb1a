"""Every import is declared in pyproject.toml, where the code that imports it is installed.

The packages may import only the core dependencies (what ``pip install fleetpulse`` brings),
benchmarks also the ``bench`` extra, tests also the ``test`` extra. An undeclared import
works on the machine that happens to have it and fails for the next user, which is how
``ddsketch`` went unnoticed; this reads the source (``ast``), so it needs no install to
catch one.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "fleetpulse", "agent", "aggregator", "detector")
FIRST_PARTY = {*PACKAGES, "benchmarks", "tests"}
# Test-local modules imported by name (tests/ is on sys.path under pytest).
TEST_LOCAL = {p.stem for p in (ROOT / "tests").glob("*.py")} | {"fakes"}
# Package code that imports a bench peer on purpose, lazily, behind an explicit choice.
OPTIONAL_IN_PACKAGES = {
    "krcf": "detector.engines.krcf_engine: the reference engine, used only when configured",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> dict[str, set[str]]:
    """Distribution names per install: core, core + bench, core + bench + test."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})

    def names(reqs: list[str]) -> set[str]:
        out: set[str] = set()
        for req in reqs:
            m = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", req)
            assert m, req
            if _norm(m[1]) == "fleetpulse":  # a self-reference: fleetpulse[bench]
                for extra in (m[2] or "").split(","):
                    out |= names(extras[extra.strip()])
            else:
                out.add(_norm(m[1]))
        return out

    core = names(project["dependencies"])
    bench = core | names(extras["bench"])
    return {"packages": core, "benchmarks": bench, "tests": bench | names(extras["test"])}


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    """Top-level module names that ``path`` imports absolutely, with their line numbers."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.partition(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.partition(".")[0], node.lineno


def _distributions(module: str, known: Mapping[str, list[str]]) -> set[str]:
    """Which distributions provide ``module``; its own name when it is not installed here."""
    return {_norm(d) for d in known.get(module, [module])}


def test_every_import_is_a_declared_dependency() -> None:
    declared = _declared()
    known = importlib.metadata.packages_distributions()
    where = {**{p: "packages" for p in PACKAGES}, "benchmarks": "benchmarks", "tests": "tests"}
    undeclared = []
    for top, group in where.items():
        for path in sorted((ROOT / top).rglob("*.py")):
            for module, line in _imports(path):
                if (module in sys.stdlib_module_names or module in FIRST_PARTY
                        or (group == "tests" and module in TEST_LOCAL)
                        or (group == "packages" and module in OPTIONAL_IN_PACKAGES)):
                    continue
                if not _distributions(module, known) & declared[group]:
                    undeclared.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not undeclared, "imports missing from pyproject.toml:\n" + "\n".join(undeclared)


def test_peers_imported_by_name_are_in_the_bench_extra() -> None:
    """``import_peer("x")`` hides ``x`` from the ast scan above; it must be a bench peer."""
    bench = _declared()["benchmarks"]
    known = importlib.metadata.packages_distributions()
    calls = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "import_peer"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                calls.append((path, str(node.args[0].value).partition(".")[0]))
    assert calls, "no benchmark imports a peer through import_peer"
    for path, module in calls:
        assert _distributions(module, known) & bench, f"{path.name}: {module} not in bench"


def test_optional_package_imports_are_in_the_bench_extra() -> None:
    bench = _declared()["benchmarks"]
    for module in OPTIONAL_IN_PACKAGES:
        assert _norm(module) in bench, module

"""Nothing in the repository reads outside it.

The dcgm fixtures were once read from ``../shared``, which exists beside the build machines'
checkouts only: the tests passed there and failed for anyone who cloned the project. A
checkout that happens to have ``../shared`` beside it cannot notice that by running, so
this looks for the path itself in every source, script and config file.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("*.py", "*.sh", "*.toml", "*.yaml", "*.service", "*.cfg", "*.ini")
SKIPPED = {".venv", ".git", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache",
           ".pytest_cache", ".hypothesis"}
FORBIDDEN = ("../shared", "FLEETPULSE_SHARED_DIR")


def test_no_file_reads_the_folder_beside_the_checkout() -> None:
    me = Path(__file__).resolve()
    found = []
    for pattern in SCANNED:
        for path in ROOT.rglob(pattern):
            rel = path.relative_to(ROOT)
            if path == me or SKIPPED & set(rel.parts) or not path.is_file():
                continue
            text = path.read_text(errors="replace")
            found += [f"{rel}: {word}" for word in FORBIDDEN if word in text]
    for script in (ROOT / ".ci").iterdir():
        text = script.read_text(errors="replace")
        found += [f".ci/{script.name}: {word}" for word in FORBIDDEN if word in text]
    assert not found, "files that reach outside the repository:\n" + "\n".join(found)

"""Where the project's ``shared/`` folder (real fixtures nobody here wrote) is found.

CI lays out a clone with a read-only copy of ``shared/`` beside it, as the developers'
machines do (``<checkout>/../shared``). ``FLEETPULSE_SHARED_DIR`` points elsewhere, e.g.
for a clone in a temporary folder. Tests and benchmarks both read the fixtures through
this one module.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

__all__ = ["DCGM_FIXTURES", "SHARED_DIR"]

_REPO: Final = Path(__file__).resolve().parents[1]
SHARED_DIR: Final = Path(os.environ.get("FLEETPULSE_SHARED_DIR") or _REPO.parent / "shared")
DCGM_FIXTURES: Final = SHARED_DIR / "fixtures" / "dcgm-exporter"

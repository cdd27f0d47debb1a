"""The series handed to a peer: name, labels, and time-ordered finite samples."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class PeerSeries:
    name: str
    labels: dict[str, str]
    ts_ms: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]


def label_text(labels: dict[str, str]) -> str:
    """Exposition label block; values escaped as the text formats require."""
    parts = []
    for k, v in labels.items():
        esc = v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'{k}="{esc}"')
    return "{" + ",".join(parts) + "}"


def finite_only(series: list[PeerSeries]) -> Iterator[PeerSeries]:
    for s in series:
        ok = np.isfinite(s.values)
        if ok.any():
            yield PeerSeries(s.name, s.labels, s.ts_ms[ok], s.values[ok])

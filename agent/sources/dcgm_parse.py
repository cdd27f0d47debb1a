"""Parse a dcgm-exporter ``/metrics`` page into one columnar tick (pure: bytes in, arrays out).

The I/O shell is :mod:`agent.sources.dcgm`; everything that can be tested on captured
output lives here (STYLE.md, Telegraf: parsing is a pure function over captured bytes).

Rules, each one learned from real exporter output (``tests/fixtures/dcgm-exporter/``):

* **Parser.** prometheus_client's text parser reads the page. If the page as a whole is not
  valid exposition text (the dcgm-exporter README's quickstart block has ``...`` elision
  lines), the page is parsed again *line by line*: each sample line that parses is kept,
  each line that does not is skipped and reported in ``invalid_lines`` (line number and
  text) - one bad line costs one sample, not the whole scrape, and is never silent.
* **Rows.** A row is one GPU entity: the ``gpu`` index label, the ``UUID`` label, and with MIG
  the ``GPU_I_ID`` (GPU instance) label. A MIG instance is its own row; its uuid is
  ``<GPU UUID>/gi<GPU_I_ID>`` so rows stay unique and the parent GPU stays readable, and
  ``GPU_I_PROFILE`` is kept in the row's labels. Samples without a ``gpu`` label (NVSwitch
  and link metrics, hand-written dummies) cannot be attributed to a GPU: they are counted
  in ``unattributed`` and skipped.
* **Labels.** Both ``Hostname`` (dcgm-exporter before PR #655) and ``hostname`` are
  accepted; ``pci_bus_id`` may be missing (older exporters); empty labels (``pod=""``) are
  treated as absent. The workload labels dcgm-exporter adds from the kubelet or its HPC
  job-mapping dir (``pod``, ``namespace``, ``container``, ``hpc_job``) are kept per row in
  ``workloads`` (read by the ``dcgm`` attribution source), not in the row itself: a new pod
  is not a new GPU.
* **Sentinels.** DCGM marks blank / not-found / not-supported / not-permissioned values
  with sentinels that old exporters print as numbers: int64 values at or above
  ``0x7ffffffffffffff0`` and the float64 values ``2**47 + 0..3``
  (``DCGM_FP64_BLANK`` and friends). They become NaN (not sampled) and are counted.
* **Fields.** ``DCGM_FI_*`` names (and their older aliases, e.g. ``CLOCK_THROTTLE_REASONS``)
  map to catalog metrics via :data:`schemas.catalog.BY_DCGM_FIELD` and are converted
  with the metric's ``dcgm_scale``. Fields outside the catalog are kept, unconverted, as
  extra metrics named after the field. ``DCGM_FI_DEV_XID_ERRORS`` reports 0 when there
  was no XID; the catalog's XID metric is NaN then.
* **Counter names.** prometheus_client's parser follows OpenMetrics and appends ``_total``
  to the samples of a ``# TYPE ... counter`` family. DCGM field names are upper case and
  never end in a lower-case ``_total``, so that suffix is removed again from ``DCGM_FI_*``
  names to get the field the exporter printed.
* **Duplicates.** The same field twice for one row keeps the last value, counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt
from prometheus_client.parser import text_string_to_metric_families

from schemas.catalog import BY_DCGM_FIELD, BY_ID, to_base_units

__all__ = ["DcgmRow", "DcgmScrape", "is_sentinel", "parse_exposition"]

INT64_SENTINEL_MIN: Final = 0x7FFFFFFFFFFFFFF0
"""DCGM_INT64_BLANK; BLANK+1..+15 are NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED, ..."""
FP64_SENTINELS: Final = frozenset(float(2**47 + i) for i in range(4))
"""DCGM_FP64_BLANK (140737488355328.0) and NOT_FOUND / NOT_SUPPORTED / NOT_PERMISSIONED."""
_XID_ID: Final = BY_DCGM_FIELD["DCGM_FI_DEV_XID_ERRORS"].id
_HOST_LABELS: Final = ("Hostname", "hostname")
_UUID_LABELS: Final = ("UUID", "uuid")
_WORKLOAD_LABELS: Final = (("pod", "pod"), ("namespace", "namespace"),
                           ("container", "container"), ("hpc_job", "job"))
"""dcgm-exporter's workload label -> fleetpulse's (schemas.attribution.WORKLOAD_LABELS)."""


def is_sentinel(value: float | int) -> bool:
    """True for DCGM's blank / not-supported markers (see the module docstring)."""
    if isinstance(value, int) and value >= INT64_SENTINEL_MIN:
        return True
    return float(value) >= float(INT64_SENTINEL_MIN) or float(value) in FP64_SENTINELS


@dataclass(frozen=True, slots=True)
class DcgmRow:
    """One GPU (or MIG instance) as the exporter labels it."""

    gpu: int
    uuid: str
    """Row uuid: the GPU UUID, plus ``/gi<N>`` for a MIG instance."""
    gpu_uuid: str
    mig_instance: str | None = None
    mig_profile: str | None = None
    model: str | None = None
    hostname: str | None = None
    pci_bus_id: str | None = None
    driver: str | None = None


@dataclass(frozen=True, slots=True)
class DcgmScrape:
    """One parsed page, columnar: ``values[row, column]`` in base units, NaN = absent."""

    rows: tuple[DcgmRow, ...]
    metric_ids: npt.NDArray[np.uint16]
    """Catalog columns first (ascending id) ..."""
    extra: tuple[str, ...]
    """... then unknown DCGM fields (sorted by name), unconverted."""
    fields: tuple[str, ...]
    """The DCGM field name behind each column (the alias when the exporter used one)."""
    values: npt.NDArray[np.float64]
    sentinels: int = 0
    unattributed: int = 0
    duplicates: int = 0
    invalid_lines: tuple[tuple[int, str], ...] = field(default=())
    workloads: tuple[dict[str, str], ...] = field(default=())
    """Per row: the workload labels the exporter attached (``job`` for ``hpc_job``)."""

    @property
    def gpus(self) -> npt.NDArray[np.int32]:
        return np.fromiter((r.gpu for r in self.rows), dtype=np.int32, count=len(self.rows))

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(r.uuid for r in self.rows)


def _field_name(name: str) -> str:
    if name.endswith("_total") and name.startswith("DCGM_FI_"):
        return name[:-6]
    return name


def _samples(text: str) -> tuple[list[tuple[str, dict[str, str], float | int]],
                                 list[tuple[int, str]]]:
    """(name, labels, value) of every sample line, plus the lines that are not valid."""
    try:
        return [
            (_field_name(s.name), s.labels, s.value)
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        ], []
    except ValueError:
        pass
    samples: list[tuple[str, dict[str, str], float | int]] = []
    invalid: list[tuple[int, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # HELP/TYPE lines only describe; a lone one is not worth re-parsing
        try:
            fams = list(text_string_to_metric_families(stripped + "\n"))
        except ValueError:
            invalid.append((lineno, line[:200]))
            continue
        samples.extend((_field_name(s.name), s.labels, s.value)
                       for fam in fams for s in fam.samples)
    return samples, invalid


def _label(labels: dict[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return None


def parse_exposition(text: str) -> DcgmScrape:
    """Parse one dcgm-exporter page. Never raises on bad content; it is counted instead."""
    samples, invalid = _samples(text)
    rows: dict[tuple[int, str, str | None], DcgmRow] = {}
    workloads: dict[tuple[int, str, str | None], dict[str, str]] = {}
    cells: dict[tuple[tuple[int, str, str | None], str | int], float] = {}
    field_of: dict[int, str] = {}
    extra_names: set[str] = set()
    sentinels = unattributed = duplicates = 0
    for name, labels, value in samples:
        gpu_label = labels.get("gpu", "")
        uuid = _label(labels, _UUID_LABELS)
        if not gpu_label.isdigit() or uuid is None:
            unattributed += 1
            continue
        gi = labels.get("GPU_I_ID") or None
        row_key = (int(gpu_label), uuid, gi)
        if row_key not in rows:
            rows[row_key] = DcgmRow(
                gpu=int(gpu_label),
                uuid=uuid if gi is None else f"{uuid}/gi{gi}",
                gpu_uuid=uuid,
                mig_instance=gi,
                mig_profile=labels.get("GPU_I_PROFILE") or None,
                model=labels.get("modelName") or None,
                hostname=_label(labels, _HOST_LABELS),
                pci_bus_id=labels.get("pci_bus_id") or None,
                driver=labels.get("DCGM_FI_DRIVER_VERSION") or None,
            )
            workloads[row_key] = {ours: labels[theirs] for theirs, ours in _WORKLOAD_LABELS
                                  if labels.get(theirs)}
        if is_sentinel(value):
            sentinels += 1
            continue
        metric = BY_DCGM_FIELD.get(name)
        col: str | int
        if metric is not None:
            col = metric.id
            field_of[metric.id] = name
        else:
            col = name
            extra_names.add(name)
        if (row_key, col) in cells:
            duplicates += 1
        cells[(row_key, col)] = float(value)

    ordered = sorted(rows, key=lambda k: (k[0], k[1], k[2] or ""))
    row_index = {k: i for i, k in enumerate(ordered)}
    ids = sorted(field_of)
    extra = tuple(sorted(extra_names))
    col_index: dict[str | int, int] = {mid: i for i, mid in enumerate(ids)}
    col_index.update({n: len(ids) + i for i, n in enumerate(extra)})
    values = np.full((len(ordered), len(ids) + len(extra)), np.nan)
    for (row_key, col), value in cells.items():
        values[row_index[row_key], col_index[col]] = value
    for j, mid in enumerate(ids):
        values[:, j] = to_base_units(values[:, j], BY_ID[mid].dcgm_scale)
        if mid == _XID_ID:
            column = values[:, j]
            column[column == 0] = np.nan
    return DcgmScrape(
        rows=tuple(rows[k] for k in ordered),
        metric_ids=np.asarray(ids, dtype=np.uint16),
        extra=extra,
        fields=tuple(field_of[m] for m in ids) + extra,
        values=values,
        sentinels=sentinels,
        unattributed=unattributed,
        duplicates=duplicates,
        invalid_lines=tuple(invalid),
        workloads=tuple(workloads[k] for k in ordered),
    )

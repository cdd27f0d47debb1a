"""The ``job_mapping`` attribution source: dcgm-exporter's HPC job-mapping directory.

dcgm-exporter's ``--hpc-job-mapping-dir`` holds one file per GPU, named by the GPU's index
(``0``, ``1``, ...) or by its UUID, whose content is the ids of the jobs on that GPU, one per
line; a scheduler prolog writes the file and the epilog empties or removes it. The same
layout serves Slurm, whose prolog/epilog scripts are where such files are usually written.

Each poll lists the directory and reads the small files (a few dozen bytes each). Several
jobs on one GPU become one workload ``job`` label, the ids joined by ``,`` in file order.
A file named by an index the metric source does not report, an unreadable file, or one
larger than 64 KiB is counted in ``skipped`` and ignored.

Options (``[attribution]``): ``job_mapping_dir``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from agent.attribution.base import (
    AttributionContext,
    AttributionSource,
    GpuView,
    Labels,
    register_attribution,
)
from agent.sources.base import SourceError

__all__ = ["JobMappingSource", "read_job_mapping"]

_MAX_FILE: Final = 64 << 10


def read_job_mapping(directory: Path, view: GpuView) -> tuple[Labels, int]:
    """(uuid -> {"job": ids}, files skipped) for one listing of ``directory``."""
    out: Labels = {}
    skipped = 0
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        raise SourceError(f"job-mapping dir {directory}: {exc.strerror or exc}") from exc
    for entry in entries:
        if entry.name.startswith("."):
            continue  # editors' and atomic writers' temporary files
        uuid = view.uuid_of(int(entry.name)) if entry.name.isdigit() else entry.name
        try:
            if uuid is None or not entry.is_file() or entry.stat().st_size > _MAX_FILE:
                skipped += 1
                continue
            text = Path(entry.path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            skipped += 1  # removed between the listing and the read: the job just ended
            continue
        jobs = [line.strip() for line in text.splitlines() if line.strip()]
        if jobs:
            out[uuid] = {"job": ",".join(jobs)}
    return out, skipped


class JobMappingSource(AttributionSource):
    """See the module docstring."""

    name = "job_mapping"

    def __init__(self, directory: str | Path) -> None:
        if not str(directory):
            raise SourceError("attribution.job_mapping_dir must be set for the job_mapping "
                              "source", retriable=False)
        self.directory = Path(directory)
        self.skipped = 0

    def describe(self) -> str:
        return f"HPC job-mapping files in {self.directory}"

    async def poll(self, view: GpuView) -> Labels:
        labels, skipped = read_job_mapping(self.directory, view)
        self.skipped += skipped
        return labels


@register_attribution("job_mapping")
def _open(ctx: AttributionContext) -> AttributionSource:
    return JobMappingSource(str(ctx.options.get("job_mapping_dir", "")))

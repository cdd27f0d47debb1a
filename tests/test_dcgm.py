"""The dcgm source on every captured dcgm-exporter page, served by a real local HTTP server.

Expected values come from a deliberately naive reference reader written here (one regex per
line, one dict per sample), independent of prometheus_client, and are compared GPU by GPU
and field by field with what the source returned over HTTP.
"""

from __future__ import annotations

import math
import re
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from agent.sources.base import SourceContext, SourceError, open_source
from agent.sources.dcgm import DcgmSource
from agent.sources.dcgm_parse import INT64_SENTINEL_MIN, parse_exposition
from benchmarks.dcgm_fixtures import DCGM_FIXTURES, dcgm_fixture_files
from schemas.catalog import BY_DCGM_FIELD, BY_ID, to_base_units
from schemas.identity import NodeIdentity
from schemas.records import EventKind

FIXTURES = DCGM_FIXTURES
FILES = dcgm_fixture_files()

_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)\s*$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"')

MIG_PAGE = """\
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA A30",GPU_I_PROFILE="1g.6gb",GPU_I_ID="3",hostname="node-7"} 41
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aaaa",device="nvidia0",modelName="NVIDIA A30",GPU_I_PROFILE="2g.12gb",GPU_I_ID="5",hostname="node-7"} 42
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-bbbb",device="nvidia1",modelName="NVIDIA A30",hostname="node-7"} 43
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-aaaa",GPU_I_PROFILE="1g.6gb",GPU_I_ID="3",hostname="node-7"} 0
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-aaaa",GPU_I_PROFILE="2g.12gb",GPU_I_ID="5",hostname="node-7"} 0
DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-bbbb",hostname="node-7"} 79
DCGM_FI_PROF_NEW_FIELD_NOBODY_KNOWS{gpu="1",UUID="GPU-bbbb",hostname="node-7"} 12.5
DCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-bbbb",hostname="node-7"} 140737488355328
"""


def reference(text: str) -> tuple[dict[tuple[str, str], float], list[int], int]:
    """(row uuid, field) -> raw value; invalid line numbers; sentinel count. Slow on purpose."""
    expected: dict[tuple[str, str], float] = {}
    invalid, sentinels = [], 0
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            invalid.append(lineno)
            continue
        name, labels_text, value_text = m.groups()
        labels = dict(_LABEL.findall(labels_text or ""))
        if "gpu" not in labels:
            continue
        uuid = labels["UUID"] + (f"/gi{labels['GPU_I_ID']}" if labels.get("GPU_I_ID") else "")
        if (value_text.isdigit() and int(value_text) >= INT64_SENTINEL_MIN) or \
                float(value_text) in {2.0**47 + i for i in range(4)}:
            sentinels += 1
            continue
        expected[(uuid, name)] = float(value_text)
    return expected, invalid, sentinels


@pytest.fixture
async def exporter() -> AsyncIterator[tuple[str, dict[str, str]]]:
    """A real HTTP server on 127.0.0.1 serving whatever page the test puts in ``pages``."""
    pages: dict[str, str] = {}

    async def handle(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in pages:
            return web.Response(status=500, text="exporter failed")
        return web.Response(text=pages[name], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{name}/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", pages
    await runner.cleanup()


def test_every_fixture_is_present() -> None:
    assert len(FILES) >= 4, f"expected the dcgm-exporter fixtures in {FIXTURES}"


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
async def test_fixture_over_http_gpu_by_gpu(path: Path,
                                            exporter: tuple[str, dict[str, str]]) -> None:
    base, pages = exporter
    text = path.read_text()
    pages["x"] = text
    ctx = SourceContext(NodeIdentity("c", "r", "k", "n"), 1.0, {"url": f"{base}/x/metrics"})
    source = open_source("dcgm", ctx)
    assert isinstance(source, DcgmSource)
    await source.start()
    try:
        got = await source.gather(1_700_000_000_000)
    finally:
        await source.close()
    expected, invalid, sentinels = reference(text)
    scrape = source.last_scrape
    assert scrape is not None
    assert [n for n, _ in scrape.invalid_lines] == invalid
    assert scrape.sentinels == sentinels
    columns = [BY_ID[int(i)] for i in got.metric_ids] + list(got.extra)
    seen = 0
    for row, uuid in enumerate(got.uuids):
        for col, what in enumerate(columns):
            value = got.values[row, col]
            if isinstance(what, str):
                raw = expected.get((uuid, what))
                want = raw
            else:
                field = scrape.fields[col]
                raw = expected.get((uuid, field))
                want = None if raw is None else float(to_base_units(raw, what.dcgm_scale))
                if what.name == "fleetpulse_gpu_xid" and raw == 0:
                    want = None
            if want is None:
                assert math.isnan(value), f"{path.name} {uuid} {what}: expected no sample"
            else:
                assert value == pytest.approx(want, rel=1e-12), f"{path.name} {uuid} {what}"
                seen += 1
    xid_zero = sum(1 for (_u, f), v in expected.items() if f == "DCGM_FI_DEV_XID_ERRORS" and v == 0)
    assert seen + xid_zero == len(expected), "every sample of the file is in the tick"
    assert len(set(got.uuids)) == len(got.uuids)
    inventory = [e for e in got.events if e.kind is EventKind.INVENTORY]
    assert sorted(e.uuid for e in inventory if e.uuid) == sorted(got.uuids)


def test_h100_values_by_hand() -> None:
    """Spot checks read off the file by eye, in base units."""
    text = (FIXTURES / "sample-h100-8gpu.prom").read_text()
    scrape = parse_exposition(text)
    assert len(scrape.rows) == 8 and list(scrape.gpus) == list(range(8))
    col = {int(m): j for j, m in enumerate(scrape.metric_ids)}
    power = BY_DCGM_FIELD["DCGM_FI_DEV_POWER_USAGE"].id
    util = BY_DCGM_FIELD["DCGM_FI_DEV_MEM_COPY_UTIL"].id
    assert scrape.values[0, col[power]] == 113.611
    assert scrape.rows[0].hostname == "ip-10-0-171-111.ec2.internal"
    assert scrape.rows[5].pci_bus_id == "00000000:A8:00.0"
    # The capture stops MEM_COPY_UTIL after GPU 5: GPUs 6 and 7 have no sample, not a zero.
    assert not np.isnan(scrape.values[5, col[util]])
    assert np.isnan(scrape.values[6:, col[util]]).all()


def test_quickstart_sentinel_and_elisions() -> None:
    text = (FIXTURES / "sample-readme-quickstart-1gpu.prom").read_text()
    scrape = parse_exposition(text)
    assert scrape.sentinels == 1
    assert [t for _, t in scrape.invalid_lines] == ["...", "..."]
    mem_temp = BY_DCGM_FIELD["DCGM_FI_DEV_MEMORY_TEMP"].id
    assert mem_temp not in set(scrape.metric_ids.tolist()), "the sentinel is not a reading"
    sm = BY_DCGM_FIELD["DCGM_FI_DEV_SM_CLOCK"].id
    assert scrape.values[0, list(scrape.metric_ids).index(sm)] == 139e6


def test_t4_unlabelled_dummies_are_counted_and_aliases_map() -> None:
    scrape = parse_exposition((FIXTURES / "sample-t4-1gpu.prom").read_text())
    assert scrape.unattributed == 14
    reasons = BY_DCGM_FIELD["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].id
    j = list(scrape.metric_ids).index(reasons)
    assert scrape.fields[j] == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
    energy = BY_DCGM_FIELD["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].id
    assert scrape.values[0, list(scrape.metric_ids).index(energy)] == 128996.013
    assert "DCGM_FI_DEV_ENC_UTIL" in scrape.extra, "unknown fields are kept as extra metrics"


async def test_mig_rows_lowercase_hostname_xid_and_fp64_sentinel(
        exporter: tuple[str, dict[str, str]]) -> None:
    base, pages = exporter
    pages["mig"] = MIG_PAGE
    source = DcgmSource(f"{base}/mig/metrics")
    got = await source.gather(5)
    assert got.uuids == ("GPU-aaaa/gi3", "GPU-aaaa/gi5", "GPU-bbbb")
    assert list(got.gpus) == [0, 0, 1]
    scrape = source.last_scrape
    assert scrape is not None
    assert [r.mig_profile for r in scrape.rows] == ["1g.6gb", "2g.12gb", None]
    assert {r.hostname for r in scrape.rows} == {"node-7"}
    assert scrape.sentinels == 1
    assert got.extra == ("DCGM_FI_PROF_NEW_FIELD_NOBODY_KNOWS",)
    assert got.values[2, -1] == 12.5
    xids = [e for e in got.events if e.kind is EventKind.XID]
    assert [(e.uuid, e.data["xid"]) for e in xids] == [("GPU-bbbb", 79)]
    again = await source.gather(6)  # same page: same layout objects, no repeated events
    assert again.metric_ids is got.metric_ids and again.uuids is got.uuids
    assert again.events == ()
    await source.close()


async def test_http_failures_are_source_errors(exporter: tuple[str, dict[str, str]]) -> None:
    base, _pages = exporter
    source = DcgmSource(f"{base}/missing/metrics")
    with pytest.raises(SourceError, match="HTTP 500"):
        await source.gather(0)
    await source.close()
    dead = DcgmSource("http://127.0.0.1:9/metrics", timeout_s=0.5)
    with pytest.raises(SourceError, match="failed"):
        await dead.gather(0)
    await dead.close()
    assert dead.stats.scrape_errors == 1
    with pytest.raises(SourceError, match="http"):
        DcgmSource("file:///etc/passwd")

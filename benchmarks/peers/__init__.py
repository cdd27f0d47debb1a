"""Peers the benchmarks compare fleetpulse against, none of which fleetpulse itself needs.

Compression peers: Prometheus TSDB (promtool) and VictoriaMetrics. Each takes the same series
the benchmark encodes (finite samples only: neither peer's import format carries NaN or inf)
and reports the bytes it stored. Debian packages are installed on first use; every server
started is stopped, even on errors.

Python peers (ddsketch, krcf, river: the ``bench`` extra) are imported through
:func:`import_peer`, which turns a missing one into one line saying how to install it.
"""

from benchmarks.peers.debian import ensure_binary
from benchmarks.peers.optional import BENCH_EXTRA, import_peer, missing_peers, peer_not_measured
from benchmarks.peers.prometheus import prometheus_tsdb_bytes
from benchmarks.peers.series import PeerSeries
from benchmarks.peers.victoriametrics import victoriametrics_bytes

__all__ = [
    "BENCH_EXTRA",
    "PeerSeries",
    "ensure_binary",
    "import_peer",
    "missing_peers",
    "peer_not_measured",
    "prometheus_tsdb_bytes",
    "victoriametrics_bytes",
]

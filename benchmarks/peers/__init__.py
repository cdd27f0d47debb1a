"""Peers for the compression benchmark: Prometheus TSDB (promtool) and VictoriaMetrics.

Each peer takes the same series the benchmark encodes (finite samples only: neither peer's
import format carries NaN or inf) and reports the bytes it stored. Debian packages are
installed on first use; every server started is stopped, even on errors.
"""

from benchmarks.peers.debian import ensure_binary
from benchmarks.peers.prometheus import prometheus_tsdb_bytes
from benchmarks.peers.series import PeerSeries
from benchmarks.peers.victoriametrics import victoriametrics_bytes

__all__ = ["PeerSeries", "ensure_binary", "prometheus_tsdb_bytes", "victoriametrics_bytes"]

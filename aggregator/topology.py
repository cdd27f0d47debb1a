"""Which GPU, node and rack slots an aggregator instance has seen, and how they nest.

Slots are dense row numbers into the window arrays, assigned at first sight. Slot order
differs between runs, so everything that reduces over slots uses :meth:`Topology.layout`,
which lists a partition's GPUs, nodes and racks sorted by name: sums then add up in the
same order after a restart or on another instance.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from aggregator.series_index import EntityIndex, EntityKey
from aggregator.series_layout import N_COLUMNS
from schemas.identity import NodeIdentity

__all__ = ["PartitionLayout", "Topology"]


@dataclass(frozen=True, slots=True)
class PartitionLayout:
    """A partition's entities in canonical (name) order, with parent links."""

    gslots: npt.NDArray[np.int64]
    """GPU slots, sorted by (node path, gpu index)."""
    gpu_eids: npt.NDArray[np.int64]
    gpu_node: npt.NDArray[np.int64]
    """Local node index of each GPU."""
    node_eids: npt.NDArray[np.int64]
    node_rack: npt.NDArray[np.int64]
    """Local rack index of each node."""
    node_keys: list[EntityKey]
    rack_slots: npt.NDArray[np.int64]
    rack_eids: npt.NDArray[np.int64]
    rack_keys: list[EntityKey]
    gpu_paths: list[str]


class Topology:
    """GPU/node/rack slots of one instance, with their entity ids in the index."""

    def __init__(self, index: EntityIndex) -> None:
        self.index = index
        self._gpu: dict[tuple[str, int], int] = {}
        self._node: dict[str, int] = {}
        self._rack: dict[str, int] = {}
        self.gpu_key: list[tuple[str, int]] = []
        self.gpu_node: list[int] = []
        self.gpu_eid: list[int] = []
        self.node_key: list[EntityKey] = []
        self.node_rack: list[int] = []
        self.node_eid: list[int] = []
        self.rack_key: list[EntityKey] = []
        self.rack_eid: list[int] = []
        self.rack_partition: list[int] = []
        self.rack_metrics: list[npt.NDArray[np.bool_]] = []
        self.rack_of_gslot = np.zeros(0, np.int32)
        self._frame_cache: dict[tuple[str, bytes], npt.NDArray[np.int32]] = {}
        self._layouts: dict[int, PartitionLayout] = {}
        self.version = 0

    @property
    def n_gpus(self) -> int:
        return len(self.gpu_key)

    @property
    def n_racks(self) -> int:
        return len(self.rack_key)

    def gslots_for(self, ident: NodeIdentity, gpus: npt.NDArray[np.int32],
                   partition: int) -> npt.NDArray[np.int32]:
        """Slots of a frame's GPUs (cached per node and GPU list).

        Raises ValueError for a GPU listed twice (the frame codec does not forbid it, and
        the store needs distinct series per group): the caller dead-letters the frame.
        """
        path = ident.path
        ck = (path, gpus.tobytes())
        hit = self._frame_cache.get(ck)
        if hit is not None:
            return hit
        if np.unique(gpus).size != gpus.size:
            raise ValueError(f"frame of {path} lists a GPU index twice: {gpus.tolist()[:16]}")
        rack_path = f"{ident.cluster}/{ident.row}/{ident.rack}"
        r = self._rack.get(rack_path)
        if r is None:
            r = self._rack[rack_path] = len(self.rack_key)
            key: EntityKey = ("rack", ident.cluster, ident.row, ident.rack, "", "")
            self.rack_key.append(key)
            self.rack_eid.append(self.index.add(key))
            self.rack_partition.append(partition)
            self.rack_metrics.append(np.zeros(N_COLUMNS, bool))
        n = self._node.get(path)
        if n is None:
            n = self._node[path] = len(self.node_key)
            nkey: EntityKey = ("node", ident.cluster, ident.row, ident.rack, ident.node, "")
            self.node_key.append(nkey)
            self.node_rack.append(r)
            self.node_eid.append(self.index.add(nkey))
        out = np.empty(len(gpus), np.int32)
        for i, g in enumerate(gpus.tolist()):
            s = self._gpu.get((path, g))
            if s is None:
                s = self._gpu[(path, g)] = len(self.gpu_key)
                self.gpu_key.append((path, g))
                self.gpu_node.append(n)
                self.gpu_eid.append(self.index.add(
                    ("gpu", ident.cluster, ident.row, ident.rack, ident.node, str(g))))
                self.version += 1
            out[i] = s
        if self.rack_of_gslot.size < len(self.gpu_node):
            grown = np.empty(max(2 * self.rack_of_gslot.size, len(self.gpu_node), 64), np.int32)
            grown[: self.rack_of_gslot.size] = self.rack_of_gslot
            self.rack_of_gslot = grown
        self.rack_of_gslot[out] = r
        self._layouts.clear()
        self._frame_cache[ck] = out
        return out

    def note_metrics(self, gslots: npt.NDArray[np.int32], mcols: npt.NDArray[np.int32]) -> None:
        """Remember which metrics a frame's GPUs carry (for series listing and groups)."""
        cols = mcols[mcols >= 0]
        racks = set()
        nodes = set()
        for s in gslots.tolist():
            n = self.gpu_node[s]
            nodes.add(n)
            racks.add(self.node_rack[n])
        for r in racks:
            if not self.rack_metrics[r][cols].all():
                self.rack_metrics[r][cols] = True
                self.version += 1
                self._layouts.clear()
        ids = cols.tolist()
        eids = [self.gpu_eid[s] for s in gslots.tolist()]
        eids += [self.node_eid[n] for n in nodes] + [self.rack_eid[r] for r in racks]
        self.index.add_metrics(eids, ids)

    def layout(self, partition: int) -> PartitionLayout:
        lay = self._layouts.get(partition)
        if lay is not None:
            return lay
        racks = sorted((r for r, p in enumerate(self.rack_partition) if p == partition),
                       key=lambda r: self.rack_key[r])
        rack_local = {r: i for i, r in enumerate(racks)}
        nodes = sorted((n for n, r in enumerate(self.node_rack) if r in rack_local),
                       key=lambda n: self.node_key[n])
        node_local = {n: i for i, n in enumerate(nodes)}
        gpus = sorted((s for s, n in enumerate(self.gpu_node) if n in node_local),
                      key=lambda s: self.gpu_key[s])
        lay = PartitionLayout(
            gslots=np.asarray(gpus, np.int64),
            gpu_eids=np.asarray([self.gpu_eid[s] for s in gpus], np.int64),
            gpu_node=np.asarray([node_local[self.gpu_node[s]] for s in gpus], np.int64),
            node_eids=np.asarray([self.node_eid[n] for n in nodes], np.int64),
            node_rack=np.asarray([rack_local[self.node_rack[n]] for n in nodes], np.int64),
            node_keys=[self.node_key[n] for n in nodes],
            rack_slots=np.asarray(racks, np.int64),
            rack_eids=np.asarray([self.rack_eid[r] for r in racks], np.int64),
            rack_keys=[self.rack_key[r] for r in racks],
            gpu_paths=[f"{self.gpu_key[s][0]}/{self.gpu_key[s][1]}" for s in gpus],
        )
        self._layouts[partition] = lay
        return lay

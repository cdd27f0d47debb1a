"""Where each simulated GPU sits: cluster / row / rack / node / GPU, as index arrays.

The fleet model works on flat arrays of G GPUs; the hierarchy is a set of integer index
arrays (GPU -> node -> rack -> row) so that per-node and per-rack quantities are broadcast to
GPUs with one gather, never a Python loop. Names follow one scheme so a rack key or node path
read in Kafka or in the store says where it is:

    row  ``row-017``   rack ``rack-017-03``   node ``node-017-03-02``

Global GPU index ``g`` is the order of everything: GPU ``g`` is local GPU ``g % gpus_per_node``
of node ``g // gpus_per_node``; nodes fill racks, racks fill rows, in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from schemas.identity import NodeIdentity, check_name

__all__ = ["Topology"]


@dataclass(frozen=True)
class Topology:
    """The shape of a simulated fleet. Validated at construction; all arrays derived lazily."""

    gpus: int
    """Total GPUs. A multiple of ``gpus_per_node`` (or fewer than one node's worth)."""
    gpus_per_node: int = 8
    nodes_per_rack: int = 4
    """DGX-class racks hold few nodes: power, not space, is the limit."""
    racks_per_row: int = 8
    cluster: str = "sim"
    first_node: int = 0
    """Global index of this topology's first node. A one-node slice of a bigger fleet
    (the agent's synthetic source) keeps the names that node has in the whole fleet."""

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"a fleet needs at least one GPU, got {self.gpus}")
        if self.gpus_per_node < 1 or self.nodes_per_rack < 1 or self.racks_per_row < 1:
            raise ValueError("gpus_per_node, nodes_per_rack and racks_per_row must be >= 1")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ValueError(
                f"{self.gpus} GPUs do not fill whole nodes of {self.gpus_per_node}; "
                f"use a multiple of {self.gpus_per_node}"
            )
        if self.first_node < 0:
            raise ValueError("first_node must be >= 0")
        check_name("cluster", self.cluster)

    @property
    def gpn(self) -> int:
        """GPUs per node actually used (a fleet smaller than one node is one short node)."""
        return min(self.gpus, self.gpus_per_node)

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpn

    @cached_property
    def node_of_gpu(self) -> npt.NDArray[np.intp]:
        """Local node index (0..nodes-1) of every GPU."""
        return np.repeat(np.arange(self.nodes, dtype=np.intp), self.gpn)

    @cached_property
    def global_node(self) -> npt.NDArray[np.intp]:
        """Fleet-wide node number of each local node."""
        return np.arange(self.nodes, dtype=np.intp) + self.first_node

    @cached_property
    def rack_of_node(self) -> npt.NDArray[np.intp]:
        """Fleet-wide rack number of each local node."""
        return self.global_node // self.nodes_per_rack

    @cached_property
    def racks(self) -> npt.NDArray[np.intp]:
        """The distinct fleet-wide rack numbers present, ascending."""
        return np.unique(self.rack_of_node)

    @cached_property
    def rack_index_of_node(self) -> npt.NDArray[np.intp]:
        """Position of each node's rack in :attr:`racks` (for per-rack state arrays)."""
        return np.searchsorted(self.racks, self.rack_of_node).astype(np.intp)

    @cached_property
    def rack_index_of_gpu(self) -> npt.NDArray[np.intp]:
        return self.rack_index_of_node[self.node_of_gpu]

    @cached_property
    def slot_of_node(self) -> npt.NDArray[np.intp]:
        """Height of the node in its rack (0 = bottom); upper nodes breathe warmer air."""
        return self.global_node % self.nodes_per_rack

    @cached_property
    def local_gpu(self) -> npt.NDArray[np.int32]:
        """GPU index within its node (the NVML index)."""
        return np.tile(np.arange(self.gpn, dtype=np.int32), self.nodes)

    def gpus_of_node(self, node: int) -> slice:
        """The global GPU indices of local node ``node``, as a slice."""
        return slice(node * self.gpn, (node + 1) * self.gpn)

    def gpus_of_rack(self, rack: int) -> npt.NDArray[np.intp]:
        """Global GPU indices of every GPU in fleet-wide rack ``rack``."""
        return np.flatnonzero(self.rack_of_node[self.node_of_gpu] == rack)

    def identity(self, node: int) -> NodeIdentity:
        """The identity of local node ``node`` (what its agent would be configured with)."""
        g = int(self.global_node[node])
        rack = g // self.nodes_per_rack
        row = rack // self.racks_per_row
        return NodeIdentity(
            self.cluster,
            f"row-{row:03d}",
            f"rack-{row:03d}-{rack % self.racks_per_row:02d}",
            f"node-{row:03d}-{rack % self.racks_per_row:02d}-{g % self.nodes_per_rack:02d}",
        )

    @cached_property
    def identities(self) -> tuple[NodeIdentity, ...]:
        return tuple(self.identity(n) for n in range(self.nodes))

"""Each health rule against healthy fleets of the zoo that must not trigger it.

A rule is only worth paging on if healthy hardware cannot produce its condition. These
fleets are the zoo's hard corners for the rules (``agent.fleet.zoo.NAMED_PROFILES``): a
liquid-cooled die with whole-degree readings that hold one value for minutes through the
all-reduce rhythm (the stuck-sensor rule's old false alarm), tenth-degree sensors under
inference whose utilisation changes every second, a 3 s air-cooled PCIe card in half
degrees, pipeline bubbles and jobs on part of a node, and dcgm-exporter's default fields at
one sample per 5 s. No faults: every rule alert here is a false page.
"""

from __future__ import annotations

import numpy as np
import pytest

from agent.fleet.export import generate_zoo
from benchmarks.detection import fleet_from_data
from detector.config import DetectorConfig, ModelConfig, RackModelConfig
from detector.rules import RULES
from detector.shard import DetectorShard

PROFILES = ("liquid_cooled_integer", "inference_random", "air_pcie_fast_half_degree",
            "pipeline_bubbles", "sparse_metrics_0p2hz")


@pytest.mark.slow
@pytest.mark.parametrize("name", PROFILES)
def test_healthy_zoo_fleet_raises_no_rule_alert(name: str) -> None:
    from agent.fleet.zoo import NAMED_PROFILES

    prof = NAMED_PROFILES[name]
    duration = 5400.0 if prof.hz >= 0.5 else 14_400.0
    _, data = generate_zoo(11, 32, duration, 0, profile=prof, hz=min(prof.hz, 1.0))
    fleet = fleet_from_data(data, name)
    # The rules only: no forests (they page nobody; the benchmark scores them).
    config = DetectorConfig(model=ModelConfig(enabled=False),
                            rack=RackModelConfig(enabled=False))
    shard = DetectorShard(config)
    ids, nodes = shard.register(fleet.paths, fleet.rack_paths, fleet.node_paths)
    alerts = shard.process(ids, nodes, fleet.step_ms, fleet.gathered)
    fired = sorted({a.source for a in alerts if a.source.startswith("rule:")})
    assert fired == [], f"{name}: healthy fleet raised {fired}"
    # Every rule's condition was evaluated over these readings (none is vacuous here).
    assert len(shard.rules.rules) == len(RULES)
    assert np.isfinite(shard.features.last_resid).any()


def test_a_die_idling_into_an_unlearned_power_is_not_a_frozen_sensor() -> None:
    """Tuning draw zoo-4 (liquid, 96 s lag, whole degrees) with hot-idle faults: node 0 is
    pinned idle for the fault on its GPU 3. GPU 7 beside it cools to 34 degC and reads 34
    for an hour, which is right; its thermal model had never learned that idle power and
    its prediction came down from 48.6 degC onto the reading over that hour. That swing is
    the model learning, not a die that should have moved: no ``temperature_stuck`` (the
    rule paged GPU 7 seven times before it judged the swing's direction), while GPU 3's
    heat is still found."""
    from agent.fleet.export import generate
    from agent.fleet.faults import plan_zoo_faults
    from agent.fleet.topology import Topology
    from agent.fleet.zoo import draw_profile

    prof = draw_profile(4)
    topo = Topology(64, 8, 4, 8, "sim")
    plan = plan_zoo_faults(topo, 4, 7200, prof.hz, 504, prof, kinds=["hot_idle"])
    data = generate(64, prof.hz, 7200, seed=4, profile=prof, fault_plan=plan)
    fleet = fleet_from_data(data, "zoo-4")
    node0 = slice(0, 8)
    shard = DetectorShard(DetectorConfig(model=ModelConfig(enabled=False),
                                         rack=RackModelConfig(enabled=False)))
    ids, nodes = shard.register(fleet.paths[node0], fleet.rack_paths[node0],
                                fleet.node_paths[node0])
    alerts = shard.process(ids, nodes, fleet.step_ms, fleet.gathered[:, node0])
    fired = {(a.entity.rsplit("/", 1)[-1], a.source) for a in alerts}
    assert ("gpu-3", "rule:thermal_excess") in fired, fired
    assert not any(src == "rule:temperature_stuck" for _, src in fired), fired

"""Deterministic health rules, driven through a real DetectorShard (real forest engine)."""

from __future__ import annotations

import numpy as np
from test_detector_support import healthy, small_config, timestamps

from detector.config import RulesConfig
from detector.features import COL
from detector.shard import DetectorShard
from schemas.records import AlertRecord, AlertState, Severity

RACK = "c1/row-a/rack-1"


def _shard(rules: RulesConfig | None = None) -> tuple[DetectorShard, np.ndarray, np.ndarray]:
    shard = DetectorShard(small_config() if rules is None else small_config(rules=rules))
    paths = [f"{RACK}/node-{g // 4}/gpu-{g % 4}" for g in range(8)]
    ids, nodes = shard.register(paths, [RACK] * 8, [p.rsplit("/", 1)[0] for p in paths])
    return shard, ids, nodes


def _rule_alerts(alerts: list[AlertRecord]) -> list[tuple[str, str, str, int]]:
    return [(a.state.value, a.source, a.entity.rsplit("/", 2)[-2] + "/" +
             a.entity.rsplit("/", 1)[-1], (a.updated_ms - timestamps(1)[0]) // 1000)
            for a in alerts if a.source.startswith("rule:")]


def test_hardware_xid_fires_once_and_resolves_after_the_hold_while_app_xids_do_not() -> None:
    shard, ids, nodes = _shard()
    data = healthy(700, 8)
    data[100, 2, COL["xid"]] = 79.0  # fallen off the bus: critical
    data[120, 2, COL["xid"]] = 79.0  # a repeat keeps the same alert open
    data[100, 5, COL["xid"]] = 13.0  # graphics exception: the application's fault
    data[300, 6, COL["xid"]] = 92.0  # high single-bit ECC rate: warning
    alerts = shard.process(ids, nodes, timestamps(700), data)
    got = _rule_alerts(alerts)
    assert ("firing", "rule:xid", "node-0/gpu-2", 100) in got
    # The repeat at 120 kept it open; it resolves 45 s (event_hold_s) after the last one.
    assert [g for g in got if g[2] == "node-0/gpu-2"] == [
        ("firing", "rule:xid", "node-0/gpu-2", 100), ("resolved", "rule:xid", "node-0/gpu-2", 165)]
    assert ("firing", "rule:xid", "node-1/gpu-2", 300) in got
    assert not [g for g in got if "node-1/gpu-1" in g[2]]
    crit = next(a for a in alerts if a.entity.endswith("node-0/gpu-2"))
    assert crit.severity is Severity.CRITICAL and crit.summary.startswith("XID 79")
    warn = next(a for a in alerts if a.entity.endswith("node-1/gpu-2"))
    assert warn.severity is Severity.WARNING


def test_dbe_increase_row_remap_failure_and_slowdown_bits() -> None:
    shard, ids, nodes = _shard()
    data = healthy(400, 8)
    data[50:, 0, COL["ecc_dbe_volatile_total"]] = 1.0
    data[60:, 1, COL["row_remap_failure"]] = 1.0
    data[70:72, 3, COL["clock_event_reasons"]] = 0x40  # two steps: below open_after
    data[80:150, 4, COL["clock_event_reasons"]] = 0x20 | 0x04
    data[90:100, 5, COL["clock_event_reasons"]] = 0x80 | 0x08  # power brake
    got = _rule_alerts(shard.process(ids, nodes, timestamps(400), data))
    assert ("firing", "rule:ecc_dbe", "node-0/gpu-0", 50) in got
    assert ("firing", "rule:row_remap_failure", "node-0/gpu-1", 60) in got
    assert ("firing", "rule:thermal_slowdown", "node-1/gpu-0", 82) in got
    assert ("resolved", "rule:thermal_slowdown", "node-1/gpu-0", 179) in got  # 30 s clear
    assert ("firing", "rule:hw_slowdown", "node-1/gpu-1", 92) in got
    assert not [g for g in got if g[2] == "node-0/gpu-3"]


def test_gpu_lost_when_all_nan_or_when_silent_while_its_rack_reports() -> None:
    shard, ids, nodes = _shard()
    data = healthy(300, 8)
    data[100:, 7, :] = np.nan  # still in frames, every metric NaN
    ts = timestamps(300)
    alerts = shard.process(ids, nodes, ts[:200], data[:200])
    # GPU 6 disappears from the frames entirely; GPUs 0-5 keep reporting.
    keep = np.arange(6)
    alerts += shard.process(ids[keep], nodes[keep], ts[200:], data[200:, keep])
    got = _rule_alerts(alerts)
    assert ("firing", "rule:gpu_lost", "node-1/gpu-3", 104) in got
    lost6 = [g for g in got if g[1] == "rule:gpu_lost" and g[2] == "node-1/gpu-2"]
    assert len(lost6) == 1 and lost6[0][0] == "firing"
    assert 215 <= lost6[0][3] <= 225  # 15 s stale + 5 checks
    assert all(a.state is AlertState.FIRING for a in alerts if a.source == "rule:gpu_lost")


def test_stuck_temperature_and_error_bursts() -> None:
    shard, ids, nodes = _shard()
    data = healthy(2000, 8, seed=2)
    # Frozen from 1700, once the thermal model has learned every power it passes through.
    data[1700:, 0, COL["temperature_celsius"]] = data[1700, 0, COL["temperature_celsius"]]
    # Idle and steady: a constant reading with a flat power draw is not a stuck sensor.
    data[:, 1, COL["power_usage_watts"]] = 80.0
    data[:, 1, COL["temperature_celsius"]] = 34.0
    sbe = np.zeros(2000)
    sbe[100:110] = 25.0  # 25 corrected errors per second for 10 s
    sbe[300] = 1.0  # a lone corrected error, routine
    data[:, 2, COL["ecc_sbe_volatile_total"]] = np.cumsum(sbe)
    crc = np.zeros(2000)
    crc[150:152] = 3.0  # a few retried flits: routine
    crc[400:420] = 120.0
    data[:, 3, COL["nvlink_crc_errors_total"]] = np.cumsum(crc)
    slow = np.zeros(2000)
    slow[160:460] = np.random.default_rng(5).poisson(3.0, 300)  # a barely visible storm: 3/s
    data[:, 4, COL["ecc_sbe_volatile_total"]] = np.cumsum(slow)
    got = _rule_alerts(shard.process(ids, nodes, timestamps(2000), data))
    stuck = [g for g in got if g[1] == "rule:temperature_stuck"]
    # Every lag the GPU's history allows swings 4 degC or more with the job's cycle while the
    # reading holds: within the first full swing after the freeze (gathered faster the wider
    # the swing).
    assert stuck and stuck[0][2] == "node-0/gpu-0" and 1730 <= stuck[0][3] <= 1830, stuck
    assert all(g[2] == "node-0/gpu-0" for g in stuck)
    # 25 errors in a second is a burst at once; it resolves 45 s after the last error
    # (109), and the lone error at 300 raises nothing.
    assert [g for g in got if g[2] == "node-0/gpu-2"] == [
        ("firing", "rule:ecc_sbe_burst", "node-0/gpu-2", 100),
        ("resolved", "rule:ecc_sbe_burst", "node-0/gpu-2", 154)]
    # Three a second reach the count within about ten seconds.
    slow_alerts = [g for g in got if g[2] == "node-1/gpu-0"]
    assert slow_alerts and slow_alerts[0][:2] == ("firing", "rule:ecc_sbe_burst"), slow_alerts
    assert 160 <= slow_alerts[0][3] <= 175, slow_alerts
    links = [g for g in got if g[1] == "rule:link_errors"]
    assert links == [("firing", "rule:link_errors", "node-0/gpu-3", 400),
                     ("resolved", "rule:link_errors", "node-0/gpu-3", 464)]


def test_thermal_excess_fires_on_a_gpu_hotter_than_its_own_model_not_on_a_node_wide_rise() -> None:
    shard, ids, nodes = _shard()
    # This data alternates idle and busy every 40 s, so the thermal models need about half
    # an hour before they have learned long enough at every power they pass through.
    data = healthy(2000, 8, seed=4)
    temp = COL["temperature_celsius"]
    # GPU 2 (node 0): its heat path degrades from step 1700: +14 degC over 100 s, same load.
    data[1700:, 2, temp] += np.round(np.minimum(np.arange(300) / 100.0, 1.0) * 14.0)
    # Node 1's inlet warms by 12 degC: all four of its GPUs together, which is not one GPU's
    # heat path (the rack model and the peers see that, not this rule).
    data[1700:, 4:8, temp] += np.round(np.minimum(np.arange(300) / 100.0, 1.0) * 12.0)[:, None]
    got = _rule_alerts(shard.process(ids, nodes, timestamps(2000), data))
    excess = [g for g in got if g[1] == "rule:thermal_excess"]
    assert excess and {g[2] for g in excess} == {"node-0/gpu-2"}, excess
    # 8 degC above the model is reached about 57 s in, then held for 60 s.
    assert 1750 <= excess[0][3] <= 1840, excess


def test_thermal_excess_pages_a_die_far_over_its_model_sooner_than_one_just_over() -> None:
    # The hold is evidence that counts faster the further past the bar the die stands
    # (``features.evidence_rate``): a die 40 degC over its model (five times the 8 degC bar)
    # is no borderline case and pages in a quarter of the hold (``excess_after_s``); a die
    # 10 degC over (about 1.25 bars, its bar raised by its model's own error) takes most of it.
    hold = RulesConfig().excess_after_s
    shard, ids, nodes = _shard()
    data = healthy(2000, 8, seed=4)
    temp = COL["temperature_celsius"]
    data[1700:, 2, temp] += 40.0  # node 0: abruptly, a heat path gone
    data[1700:, 5, temp] += 10.0  # node 1: just over the bar
    got = _rule_alerts(shard.process(ids, nodes, timestamps(2000), data))
    first = {}
    for state, source, gpu, at in got:
        if source == "rule:thermal_excess" and state == "firing":
            first.setdefault(gpu, at)
    assert set(first) == {"node-0/gpu-2", "node-1/gpu-1"}, got
    assert first["node-0/gpu-2"] - 1700 <= hold / 3, first
    assert first["node-1/gpu-1"] - 1700 >= 0.6 * hold, first


def test_thermal_excess_does_not_accuse_a_gpu_whose_node_peers_run_cooler_than_their_models(
) -> None:
    # The thermal-model path alone: the path that needs no model compares readings at one
    # power outright, and by it a die 12 degC above three that draw its power on its inlet
    # is hot (``peer_excess_c``).
    shard, ids, nodes = _shard(RulesConfig(peer_excess_c=float("inf")))
    data = healthy(2000, 8, seed=4)
    temp = COL["temperature_celsius"]
    # Node 1: three of its four GPUs read 12 degC cooler than before from step 1700 (their
    # models have it wrong); GPU 4 goes on reading what its own model predicts. It is not
    # "hotter than its model and its peers": peers that run cooler than their models take
    # out no shared heat, so they accuse nothing.
    data[1700:, 5:8, temp] -= np.round(np.minimum(np.arange(300) / 100.0, 1.0) * 12.0)[:, None]
    # Node 0: GPU 2 heats as in the test above, and is still found.
    data[1700:, 2, temp] += np.round(np.minimum(np.arange(300) / 100.0, 1.0) * 14.0)
    got = _rule_alerts(shard.process(ids, nodes, timestamps(2000), data))
    excess = [g for g in got if g[1] == "rule:thermal_excess"]
    assert {g[2] for g in excess} == {"node-0/gpu-2"}, excess


def test_clock_deficit_finds_a_busy_gpu_slow_for_no_reason_but_not_a_capped_or_idle_one() -> None:
    shard, ids, nodes = _shard()
    data = healthy(600, 8, seed=6)
    clock, bits = COL["sm_clock_hertz"], COL["clock_event_reasons"]
    # From step 240 the node trains without pause: every GPU busy at full clock.
    data[240:, :, COL["utilization_ratio"]] = 0.95
    data[240:, :, clock] = 1.98e9
    data[240:, :, bits] = 0.0
    # GPU 1: from step 300 its clock is 15 % below its peers', no reason bit.
    data[300:, 1, clock] = 1.98e9 * 0.85
    # GPU 2: the same clock, but the driver says why (software power cap, at its 700 W
    # limit): not a straggler.
    data[300:, 2, clock] = 1.98e9 * 0.85
    data[300:, 2, bits] = 0x04
    data[300:, 2, COL["power_usage_watts"]] = 695.0
    # GPU 4 (node 1): the power-cap bit without the power (well below the limit) explains
    # nothing.
    data[300:, 4, clock] = 1.98e9 * 0.85
    data[300:, 4, bits] = 0x04
    # GPU 5 idles at its idle clock: not busy, not judged.
    data[300:, 5, COL["utilization_ratio"]] = 0.0
    data[300:, 5, clock] = 0.345e9
    data[300:, 5, bits] = 0x01
    got = _rule_alerts(shard.process(ids, nodes, timestamps(600), data))
    deficit = [g for g in got if g[1] == "rule:clock_deficit"]
    # GPU 4 stands 15 % below its node's clock, near twice the 8 % bar: its minute is gathered
    # at about 3.5 times the rate (the square of 1.9, ``features.evidence_rate``). GPU 1's
    # node holds GPU 2 (capped, 15 % down) among its peers, so its deficit against them is
    # just past the bar: about the whole minute.
    assert deficit == [("firing", "rule:clock_deficit", "node-1/gpu-0", 318),
                       ("firing", "rule:clock_deficit", "node-0/gpu-1", 359)], deficit


def test_a_power_cap_bit_explains_a_low_clock_only_at_the_power_the_cap_holds() -> None:
    """The governor may set the power-cap bit on a GPU whose clock something else holds
    lower (zoo-1025, zoo-1028: held-out stragglers at 86 % clock drawing 88-90 % of what
    their capped peers drew, with the bit set throughout). A cap holds a GPU's power at its
    limit; where the node's peers report the cap, their power shows where that is, also
    through a job's communication phases when they do not, and also where the limit is not
    exported."""
    shard, ids, nodes = _shard()
    data = healthy(900, 8, seed=6)
    clock, bits, util = COL["sm_clock_hertz"], COL["clock_event_reasons"], COL["utilization_ratio"]
    power, limit = COL["power_usage_watts"], COL["power_limit_watts"]
    rng = np.random.default_rng(2)
    # From step 240 both nodes train at the power cap: busy, the cap bit, 1.92 GHz, the
    # power at the limit with a few watts of noise; every 20 s a 5 s communication phase
    # at 40 % and full clock with no bit. Node 0 exports its 700 W limit, node 1 none.
    comm = (np.arange(900) % 20) >= 15
    data[240:, :, util] = np.where(comm[240:, None], 0.4, 0.93)
    data[240:, :, clock] = np.where(comm[240:, None], 1.98e9, 1.92e9)
    data[240:, :, bits] = np.where(comm[240:, None], 0.0, 0x04)
    data[240:, :, power] = np.where(comm[240:, None], 380.0,
                                    700.0 + rng.normal(0, 3, (660, 8)))
    data[:, 4:, limit] = np.nan
    # Node 0, GPU 2: from step 400, 12 % slower than its peers at 640 W, the cap bit still
    # set and never waiting for them (a straggler): 0.91 of its limit, which the cap bit
    # explained while the bar was 0.9 of the limit.
    data[400:, 2, util] = 1.0
    data[400:, 2, clock] = 1.92e9 * 0.88
    data[400:, 2, bits] = 0x04
    data[400:, 2, power] = 640.0 + rng.normal(0, 3, 500)
    # Node 0, GPU 3: a hungrier die that the cap holds 4 % lower at the same power: healthy.
    data[400:, 3, clock] = np.where(comm[400:], 1.98e9, 1.92e9 * 0.96)
    # Node 1, GPU 1 (gpu 5): the same straggler with no limit exported.
    data[400:, 5, util] = 1.0
    data[400:, 5, clock] = 1.92e9 * 0.88
    data[400:, 5, bits] = 0x04
    data[400:, 5, power] = 640.0 + rng.normal(0, 3, 500)
    got = _rule_alerts(shard.process(ids, nodes, timestamps(900), data))
    deficit = [g for g in got if g[1] == "rule:clock_deficit" and g[0] == "firing"]
    assert sorted(g[2] for g in deficit) == ["node-0/gpu-2", "node-1/gpu-1"], deficit
    # 12 % down, one and a half times the 8 % bar: the minute gathered in about 27 s (2.25
    # times the rate).
    assert all(420 <= g[3] <= 520 for g in deficit), deficit


def test_clock_deficit_judges_a_working_gpu_only_on_a_deep_deficit_and_sooner_the_deeper() -> None:
    shard, ids, nodes = _shard()
    data = healthy(600, 8, seed=6)
    clock, bits, util = COL["sm_clock_hertz"], COL["clock_event_reasons"], COL["utilization_ratio"]
    data[240:, :, util] = 0.95
    data[240:, :, clock] = 1.98e9
    data[240:, :, bits] = 0.0  # a dcgm-exporter subset: no reasons at all
    # GPU 1 works half the time and its clock halves (a power brake nobody reports): deep,
    # so found, and sooner than a shallow deficit's 60 s.
    data[300:, 1, util] = 0.5
    data[300:, 1, clock] = 1.98e9 * 0.5
    # GPU 2 works half the time 9 % below its peers: shallow, and not busy: not judged.
    data[300:, 2, util] = 0.5
    data[300:, 2, clock] = 1.98e9 * 0.91
    # GPU 5 barely works (20 %) at half clock: a lower clock state between kernels.
    data[300:, 5, util] = 0.2
    data[300:, 5, clock] = 1.98e9 * 0.5
    got = _rule_alerts(shard.process(ids, nodes, timestamps(600), data))
    deficit = [g for g in got if g[1] == "rule:clock_deficit"]
    assert [g[2] for g in deficit] == ["node-0/gpu-1"], deficit
    assert 310 <= deficit[0][3] < 340, deficit


def test_clock_deficit_adds_up_across_a_pipeline_jobs_bubbles_but_not_across_clock_ramps() -> None:
    shard, ids, nodes = _shard()
    data = healthy(600, 8, seed=6)
    clock, bits, util = COL["sm_clock_hertz"], COL["clock_event_reasons"], COL["utilization_ratio"]
    data[240:, :, clock] = 1.98e9
    data[240:, :, bits] = 0.0
    data[240:, :, util] = 0.95
    # Node 0 runs a pipeline: 15 s busy, 15 s in the bubble at 10 %, every GPU alike.
    bubble = (np.arange(600) // 15) % 2 == 1
    data[240:, :4, util] = np.where(bubble[240:, None], 0.1, 0.95)
    # GPU 1 is braked to 74 % of the clock, no reason reported (a power brake behind a
    # dcgm-exporter subset): never 60 s busy in a row, yet found.
    data[300:, 1, clock] = 1.98e9 * 0.74
    # GPU 2 only lags on the first second of each burst (its clock ramping up from the
    # bubble), then runs at speed: the busy seconds at speed start the evidence over.
    ramp = np.flatnonzero(~bubble[1:] & bubble[:-1]) + 1
    ramp = ramp[ramp >= 300]
    data[ramp, 2, clock] = 1.98e9 * 0.74
    got = _rule_alerts(shard.process(ids, nodes, timestamps(600), data))
    deficit = [g for g in got if g[1] == "rule:clock_deficit"]
    assert [g[2] for g in deficit if g[0] == "firing"] == ["node-0/gpu-1"], deficit


def test_a_sensor_that_always_flickers_is_stuck_when_it_holds_while_its_model_wanders() -> None:
    # Its own run lengths at a power are trusted after ten minutes learned there (half an
    # hour by default).
    shard = DetectorShard(small_config(rules=RulesConfig(stuck_history_s=600.0)))
    paths = [f"{RACK}/node-{g // 4}/gpu-{g % 4}" for g in range(8)]
    ids, nodes = shard.register(paths, [RACK] * 8, [p.rsplit("/", 1)[0] for p in paths])
    steps = 3000
    data = healthy(steps, 8, seed=7)
    rng = np.random.default_rng(8)
    # Inference whose utilisation changes every second: power random in 100-500 W, so the
    # die (15 s lag) wanders by a few degrees but never by the 4 degC of the first test;
    # tenth-degree sensors with noise change value nearly every second.
    power = rng.uniform(100.0, 500.0, (steps, 8))
    temp = np.empty((steps, 8))
    t = np.full(8, 45.0)
    for k in range(steps):
        t += (30 + 0.06 * power[k] - t) / 15.0
        temp[k] = t
    data[:, :, COL["power_usage_watts"]] = power
    data[:, :, COL["utilization_ratio"]] = (power - 80.0) / 500.0
    data[:, :, COL["temperature_celsius"]] = np.round(temp + rng.normal(0, 0.2, temp.shape), 1)
    data[:, :, COL["sm_clock_hertz"]] = 1.98e9
    data[:, :, COL["clock_event_reasons"]] = 0.0
    frozen_at = 2400
    data[frozen_at:, 3, COL["temperature_celsius"]] = data[frozen_at, 3, COL["temperature_celsius"]]
    got = _rule_alerts(shard.process(ids, nodes, timestamps(steps), data))
    stuck = [g for g in got if g[1] == "rule:temperature_stuck"]
    assert stuck and {g[2] for g in stuck} == {"node-0/gpu-3"}, stuck
    # Twice stuck_after_s (the runs it showed were seconds long, so 10x theirs is less).
    hold = RulesConfig().stuck_after_s
    assert frozen_at + 2 * hold <= stuck[0][3] <= frozen_at + 2 * hold + 10, stuck


def test_a_lone_error_after_a_storm_has_ended_is_not_a_new_burst() -> None:
    """zoo-1369 (held-out): a link erred ~8 times a second for 18 minutes, the alert ended
    45 s after the last error, and one routine PCIe replay a minute later paged again: the
    storm's count, decaying over a minute, still weighed about 90. Once a burst's alert has
    ended, its count starts over; a new storm is still a burst."""
    shard, ids, nodes = _shard()
    data = healthy(1400, 8, seed=2)
    link = np.zeros(1400)
    link[200:500] = np.random.default_rng(3).poisson(8.0, 300)  # the storm, to 500 s
    link[600] = 1.0  # one replay, 100 s after it stopped
    link[1000:1060] = np.random.default_rng(4).poisson(3.0, 60)  # a new, smaller storm
    data[:, 5, COL["pcie_replay_errors_total"]] = np.cumsum(link)
    sbe = np.zeros(1400)
    sbe[200:500] = np.random.default_rng(5).poisson(8.0, 300)
    sbe[590] = 2.0  # two corrected errors, 90 s after the storm
    data[:, 6, COL["ecc_sbe_volatile_total"]] = np.cumsum(sbe)
    got = _rule_alerts(shard.process(ids, nodes, timestamps(1400), data))
    links = [g for g in got if g[2] == "node-1/gpu-1"]
    assert [g[:2] for g in links] == [("firing", "rule:link_errors"),
                                      ("resolved", "rule:link_errors"),
                                      ("firing", "rule:link_errors"),
                                      ("resolved", "rule:link_errors")], links
    assert 200 <= links[0][3] <= 205 and 540 <= links[1][3] <= 550, links
    assert 1000 <= links[2][3] <= 1015, links
    sbe_alerts = [g for g in got if g[2] == "node-1/gpu-2"]
    assert [g[:2] for g in sbe_alerts] == [("firing", "rule:ecc_sbe_burst"),
                                           ("resolved", "rule:ecc_sbe_burst")], sbe_alerts

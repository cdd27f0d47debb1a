"""Alerts into incidents and actions (detector.incidents, detector.actions): the XID
catalogue as data, repeats escalating, one incident per cause."""

from __future__ import annotations

import dataclasses

import pytest

from detector.actions import CATALOGUE_PATH, ActionBook
from detector.incidents import Correlator
from detector.rules import HARDWARE_XIDS
from schemas.records import (
    Action,
    AlertRecord,
    AlertState,
    IncidentRecord,
    Severity,
    decode_alerts_topic,
)

T = 1_767_225_600_000
RACK = "c1/row-a/rack-3"


def _alert(entity: str, source: str, t_s: float, severity: Severity = Severity.WARNING,
           level: str | None = None, **context: object) -> AlertRecord:
    ts = T + int(t_s * 1000)
    return AlertRecord(
        id=f"{entity}|{source}|{ts}", entity=entity,
        level=level or ("rack" if entity.count("/") == 2 else "gpu"),
        state=AlertState.FIRING, severity=severity, source=source, summary=source,
        score=1.0, threshold=1.0, started_ms=ts, updated_ms=ts, context=dict(context))


def _resolved(rec: AlertRecord, t_s: float) -> AlertRecord:
    return dataclasses.replace(rec, state=AlertState.RESOLVED,
                               updated_ms=T + int(t_s * 1000))


def _gpu(node: int, gpu: int) -> str:
    return f"{RACK}/node-{node}/gpu-{gpu}"


def test_catalogue_covers_the_hardware_xids_and_every_rule() -> None:
    book = ActionBook()
    assert "docs.nvidia.com" in CATALOGUE_PATH.read_text()  # says where it comes from
    for code in HARDWARE_XIDS:
        assert code in book.xids and book.xids[code].hardware, code
    assert book.xid(79).action is Action.DRAIN_REBOOT
    assert book.xid(13).action is Action.RESTART_APP and not book.xid(13).hardware
    assert book.xid(999) == book.default
    xid = _alert(_gpu(0, 1), "rule:xid", 0, value=79.0)
    assert book.action_for(xid) is Action.DRAIN_REBOOT
    assert book.action_for(_alert(_gpu(0, 1), "rule:event_xid", 0, xid=48)) is Action.RESET_GPU
    assert book.action_for(_alert(RACK, "rule:rack_heat", 0)) is Action.CHECK_COOLING
    assert book.action_for(_alert(_gpu(0, 1), "model:numba", 0)) is Action.NONE
    assert book.action_for(_alert(_gpu(0, 1), "rule:row_remap_failure", 0)) is Action.REPLACE


def test_catalogue_covers_every_code_of_nvidias_xid_catalogue() -> None:
    """NVIDIA's catalogue (Ampere and newer) lists codes 1-172: none may go missing."""
    book = ActionBook()
    assert set(range(1, 173)) <= set(book.xids), sorted(set(range(1, 173)) - set(book.xids))
    for code, entry in book.xids.items():
        assert isinstance(entry.action, Action) and entry.meaning.strip(), code
    codes = [int(line[len("[xid."):-1]) for line in CATALOGUE_PATH.read_text().splitlines()
             if line.startswith("[xid.")]
    assert codes == sorted(codes)  # the file stays in numeric order


def test_a_bad_catalogue_says_which_entry(tmp_path: pytest.TempPathFactory) -> None:
    bad = tmp_path / "cat.toml"  # type: ignore[operator]
    bad.write_text(CATALOGUE_PATH.read_text().replace('action = "restart_app"',
                                                       'action = "pray"', 1))
    with pytest.raises(ValueError, match="pray"):
        ActionBook(bad)


def test_the_metric_and_event_view_of_one_xid_are_one_incident() -> None:
    c = Correlator()
    metric = _alert(_gpu(2, 5), "rule:xid", 10, value=63.0)
    event = _alert(_gpu(2, 5), "rule:event_xid", 10.4, xid=63)
    alerts, incidents = c.observe([metric])
    assert alerts[0].action is Action.RESET_GPU
    assert alerts[0].context["xid_meaning"].startswith("ECC page retirement")
    (inc,) = incidents
    assert inc.state is AlertState.FIRING and inc.cause == "xid:63" and inc.root == _gpu(2, 5)
    alerts, incidents = c.observe([event])
    assert alerts[0].context["incident"] == inc.id
    assert incidents[0].members == (metric.id, event.id) and incidents[0].revision == 1
    _, incidents = c.observe([_resolved(metric, 70)])
    assert incidents[0].state is AlertState.FIRING  # one member still open
    _, incidents = c.observe([_resolved(event, 80)])
    assert incidents[0].state is AlertState.RESOLVED and incidents[0].updated_ms == T + 80_000
    assert not c.open


def test_an_ecc_storm_and_its_xids_are_one_incident() -> None:
    c = Correlator()
    storm = _alert(_gpu(1, 0), "rule:ecc_sbe_burst", 0)
    dbe = _alert(_gpu(1, 0), "rule:xid", 30, Severity.CRITICAL, value=95.0)
    _, (first,) = c.observe([storm])
    _, (inc,) = c.observe([dbe])
    assert inc.id == first.id and inc.severity is Severity.CRITICAL
    assert inc.cause == "ecc_sbe_burst" and inc.action is Action.RESET_GPU  # the storm led


def test_a_more_disruptive_cause_on_the_gpu_takes_the_lead() -> None:
    c = Correlator()
    c.observe([_alert(_gpu(1, 0), "rule:thermal_excess", 0)])
    _, (inc,) = c.observe([_alert(_gpu(1, 0), "rule:xid", 9, Severity.CRITICAL, value=79.0)])
    assert inc.cause == "xid:79" and inc.action is Action.DRAIN_REBOOT
    assert len(inc.members) == 2


def test_a_rack_alert_absorbs_its_gpus_thermal_alerts_but_not_their_xids() -> None:
    c = Correlator(window_s=300)
    early = [_alert(_gpu(n, g), "rule:thermal_slowdown", 20 + n) for n in range(3)
             for g in range(2)]
    xid = _alert(_gpu(0, 7), "rule:xid", 25, Severity.CRITICAL, value=79.0)
    other_rack = _alert("c1/row-a/rack-4/node-0/gpu-0", "rule:thermal_slowdown", 25)
    _, incs = c.observe([*early, xid, other_rack])
    assert len(incs) == 8
    rack = _alert(RACK, "rule:rack_heat", 60)
    late = _alert(_gpu(5, 3), "rule:thermal_slowdown", 90)
    alerts, incs = c.observe([rack, late])
    by_id = {i.id: i for i in incs}
    root = next(i for i in incs if i.root == RACK)
    merged = [i for i in incs if i.merged_into]
    assert len(merged) == 6 and all(i.merged_into == root.id for i in merged)
    assert all(i.state is AlertState.RESOLVED for i in merged)
    assert set(root.members) == {a.id for a in early} | {rack.id, late.id}
    assert root.action is Action.CHECK_COOLING and root.cause == "rack_heat"
    assert alerts[1].context["incident"] == root.id
    assert len(by_id) == 7
    # the XID and the other rack's alert stay their own incidents
    assert c.incident_of(xid.id) not in (None, root.id)
    assert c.incident_of(other_rack.id) not in (None, root.id)
    # the rack incident ends when its last member resolves
    _, incs = c.observe([_resolved(a, 200) for a in [*early, rack]])
    assert incs[0].state is AlertState.FIRING
    _, incs = c.observe([_resolved(late, 260)])
    assert incs[0].state is AlertState.RESOLVED and incs[0].id == root.id


def test_the_rack_heat_rule_leads_a_rack_incident_the_rack_forest_opened() -> None:
    c = Correlator()
    _, (inc,) = c.observe([_alert(RACK, "model:numba:rack", 0)])
    assert inc.cause == "model" and inc.action is Action.NONE
    _, (inc,) = c.observe([_alert(_gpu(0, 0), "rule:thermal_slowdown", 5)])
    assert inc.action is Action.CHECK_COOLING  # the forest names no action: its members do
    _, (inc,) = c.observe([_alert(RACK, "rule:rack_heat", 40)])
    assert (inc.cause, inc.action, len(inc.members)) == ("rack_heat", Action.CHECK_COOLING, 3)


def test_an_info_signal_joins_an_open_incident_but_never_opens_one() -> None:
    c = Correlator()
    gpu = _gpu(0, 1)
    alone = _alert(gpu, "model:numba", 0, Severity.INFO)
    alerts, incs = c.observe([alone])
    assert incs == [] and "incident" not in alerts[0].context
    assert c.incident_of(alone.id) is None
    _, incs = c.observe([_alert(RACK, "model:numba:rack", 5, Severity.INFO)])
    assert incs == []
    _, incs = c.observe([_resolved(alone, 30)])
    assert incs == []
    # beside a rule's alert on the same GPU it is part of that incident, at its severity
    rule = _alert(gpu, "rule:thermal_excess", 100)
    _, (inc,) = c.observe([rule])
    later = _alert(gpu, "model:numba", 110, Severity.INFO)
    alerts, (inc2,) = c.observe([later])
    assert alerts[0].context["incident"] == inc.id == inc2.id
    assert inc2.severity is Severity.WARNING and set(inc2.members) == {rule.id, later.id}


def test_gpu_alerts_long_before_the_rack_alert_stay_apart() -> None:
    c = Correlator(window_s=60)
    old = _alert(_gpu(0, 0), "rule:thermal_slowdown", 0)
    c.observe([old])
    _, incs = c.observe([_alert(RACK, "rule:rack_heat", 500)])
    assert len(incs) == 1 and c.incident_of(old.id) != incs[0].id


def test_three_resets_of_one_gpu_in_a_day_escalate_to_replace() -> None:
    c = Correlator()
    actions = []
    for k in range(3):
        a = _alert(_gpu(0, 2), "rule:xid", k * 3600, value=48.0)
        alerts, (inc,) = c.observe([a])
        actions.append((alerts[0].action, inc.action))
        c.observe([_resolved(a, k * 3600 + 120)])
    assert actions == [(Action.RESET_GPU, Action.RESET_GPU)] * 2 + [
        (Action.REPLACE, Action.REPLACE)]
    # another GPU is not affected, nor the same one a day and more later
    a = _alert(_gpu(0, 3), "rule:xid", 3 * 3600, value=48.0)
    assert c.observe([a])[0][0].action is Action.RESET_GPU
    b = _alert(_gpu(0, 2), "rule:xid", 30 * 3600, value=48.0)
    assert c.observe([b])[0][0].action is Action.RESET_GPU


def test_incident_records_share_the_alerts_topic() -> None:
    c = Correlator()
    (alert,), (inc,) = c.observe([_alert(_gpu(0, 0), "rule:gpu_lost", 0, Severity.CRITICAL)])
    assert decode_alerts_topic(alert.to_bytes()) == alert
    assert decode_alerts_topic(inc.to_bytes()) == inc
    assert isinstance(decode_alerts_topic(inc.to_bytes()), IncidentRecord)
    assert inc.action is Action.DRAIN_REBOOT and "drain_reboot" in inc.summary
    # an alert written before `action` existed still reads
    legacy = alert.to_bytes().replace(b',"action":"drain_reboot"', b"")
    assert AlertRecord.from_bytes(legacy).action is Action.NONE

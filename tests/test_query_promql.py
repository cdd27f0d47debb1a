"""The PromQL subset parser and the engine's tier choice."""

from __future__ import annotations

import pytest

from aggregator.promql import Aggregate, PromQLError, Selector, parse


def test_selectors_and_aggregations_parse():
    assert parse('fleetpulse_x{rack=~"r.*", gpu!="3"}') == Selector((
        ("__name__", "=", "fleetpulse_x"), ("rack", "=~", "r.*"), ("gpu", "!=", "3")))
    e = parse('sum by (rack, row) (fleetpulse_x{level="gpu"})')
    assert isinstance(e, Aggregate) and e.op == "sum" and e.by == ("rack", "row")
    e = parse("quantile(0.9, avg without (gpu) (fleetpulse_x))")
    assert isinstance(e, Aggregate) and e.param == 0.9 and isinstance(e.expr, Aggregate)
    assert e.expr.without == ("gpu",)
    assert parse("max(x) by (rack)") == Aggregate("max", Selector((("__name__", "=", "x"),)),
                                                   by=("rack",))
    assert parse("{level='rack', agg=\"p95\",}").matchers[1] == ("agg", "=", "p95")


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "empty"), ("x{", "expected"), ('{rack!="a"}', "non-empty matcher"),
    ("quantile(2, x)", "within [0, 1]"), ("x y", "unexpected"), ("x{a==\"b\"}", "expected"),
    ("rate(x[5m])", "unexpected"), ('x{a=~"("}', "regular expression"),
])
def test_errors_say_what_is_wrong(text, fragment):
    with pytest.raises(PromQLError, match=fragment.replace("[", r"\[")):
        parse(text)


def test_tier_choice_follows_step_retention_and_resolution(tmp_path):
    from aggregator.query_engine import QueryEngine, QueryError
    from aggregator.series_index import EntityIndex
    from aggregator.store import SeriesStore, StoreConfig

    store = SeriesStore(StoreConfig(path=str(tmp_path / "s"), fsync=False))
    try:
        qe = QueryEngine(store, EntityIndex(None))
        now = 100 * 86_400_000
        assert qe.choose_tier(1000, now - 3_600_000, now, None) == "raw"
        assert qe.choose_tier(10_000, now - 3_600_000, now, None) == "10s"
        assert qe.choose_tier(60_000, now - 3_600_000, now, None) == "1m"
        assert qe.choose_tier(300_000, now - 3_600_000, now, None) == "1m"
        assert qe.choose_tier(3_600_000, now - 3_600_000, now, None) == "1h"
        assert qe.choose_tier(10_000, now - 30 * 86_400_000, now, None) == "1m"  # 10s expired
        assert qe.choose_tier(10_000, now - 90 * 86_400_000, now, None) == "1h"
        assert qe.choose_tier(60_000, 0, now, "10s") == "10s"
        with pytest.raises(QueryError, match="resolution"):
            qe.choose_tier(60_000, 0, now, "5m")
    finally:
        store.close()

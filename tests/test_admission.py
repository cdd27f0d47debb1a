"""The pace of cold-start admission (``detector.admission``) on a clock the test moves."""

from __future__ import annotations

from detector.admission import Admission


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_bucket_holds_a_second_of_admissions_and_refills_at_the_rate() -> None:
    clock = _Clock()
    a = Admission(per_s=10.0, within_s=5.0, busy_below=0.75, clock=clock)
    assert a.allowance(0.5) == 10
    a.admitted(10)
    assert a.allowance(0.5) == 0
    clock.t += 0.35
    assert a.allowance(0.5) == 3
    clock.t += 60.0  # a long quiet spell still allows one second's worth, no more
    assert a.allowance(0.5) == 10


def test_nothing_is_admitted_while_behind_or_busy() -> None:
    clock = _Clock()
    a = Admission(per_s=10.0, within_s=5.0, busy_below=0.75, clock=clock)
    assert a.allowance(5.0) == 0  # the chunk's oldest record waited admit_within_s
    clock.t += 2.0
    a.worked(1.9)  # 95 % of a 2 s window
    assert 0.28 < a.busy_ratio < 0.29  # smoothed: a third of the way there
    for _ in range(5):
        clock.t += 2.0
        a.worked(1.9)
    assert a.busy_ratio > 0.75 and a.allowance(0.5) == 0
    for _ in range(10):
        clock.t += 2.0
        a.worked(0.2)
    assert a.busy_ratio < 0.75 and a.allowance(0.5) == 10


def test_zero_within_admits_everything_and_zero_rate_only_gates() -> None:
    clock = _Clock()
    assert Admission(10.0, 0.0, 0.75, clock).allowance(100.0) is None
    gated = Admission(0.0, 5.0, 0.75, clock)
    assert gated.allowance(1.0) is None and gated.allowance(6.0) == 0

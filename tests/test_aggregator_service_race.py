"""The service's durability cycle against a rebalance callback that runs in its middle.

The Kafka adapter runs rebalance callbacks whenever the consumer is not holding a batch,
which includes the time after an empty ``getmany`` while the service awaits rollup
acknowledgements in its periodic cycle. A partition revoked then must not be checkpointed
by the cycle that resumes afterwards (its state is gone from the stage: that was a
KeyError that killed the consumer loop). And a commit the group refuses because it
rebalanced is a crash between checkpoint and commit, not a reason to exit (it made a
restarted detector or aggregator exit 1 when its killed predecessor expired from the group).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from test_aggregator_support import make_fleet

from aggregator.config import AggregatorConfig
from aggregator.service import AggregatorService, _Loop
from fleetpulse.config import TransportConfig


async def _checkpointed(loop: _Loop, partition: int) -> bool:
    """Whether the group's changelog holds a checkpoint of ``partition``."""
    return (loop.topic, partition) in await loop.changelog.load([(loop.topic, partition)])


@contextlib.asynccontextmanager
async def _joined_service(tmp_path: Path, name: str) -> AsyncIterator[tuple[AggregatorService,
                                                                            _Loop]]:
    """A started service (no HTTP, no row stage) whose sample consumer owns both partitions
    of an empty topic on its own memory broker; stopped and closed afterwards."""
    cfg = AggregatorConfig(transport=TransportConfig(bootstrap=f"memory://agg-{name}",
                                                     topic_prefix=name),
                           data_dir=str(tmp_path / "d"), listen="127.0.0.1:0",
                           lateness_ms=5000, row_stage=False, fsync=False,
                           samples_partitions=2)
    svc = AggregatorService(cfg)
    await svc.start(serve_http=False)
    try:
        loop = svc.loops[0]
        assert loop.consumer is not None
        for _ in range(100):  # join the group: its callback assigns both partitions
            assert await loop.consumer.getmany(timeout_ms=20) == []
            if loop.owned == {0, 1}:
                break
        assert loop.owned == {0, 1}
        yield svc, loop
    finally:
        for lp in svc.loops:
            if lp.consumer is not None:
                await lp.consumer.stop()
        await svc.close()


async def test_revoke_while_the_cycle_awaits_acknowledgements(tmp_path):
    async with _joined_service(tmp_path, "race") as (svc, loop):
        assert loop.consumer is not None
        fl = make_fleet(n_racks=2, seconds=40, partitions=2)
        await svc.handle(loop, fl.messages)
        assert svc.rack.parts.keys() == {0, 1}
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        svc._pending.append((ack, b"", b""))  # a rollup whose acknowledgement is pending
        cycle = asyncio.create_task(svc.durable(loop, {0, 1}))
        await asyncio.sleep(0.05)
        assert not cycle.done()  # waiting for the acknowledgement
        await loop.on_revoked(frozenset({(loop.topic, 0)}))  # the callback runs meanwhile
        assert 0 not in svc.rack.parts and loop.owned == {1}
        ack.set_result(None)
        await asyncio.wait_for(cycle, 30)  # no KeyError for the revoked partition
        assert await _checkpointed(loop, 0)  # by the revoke
        assert await _checkpointed(loop, 1)  # by the cycle


async def test_a_commit_refused_by_a_rebalance_does_not_stop_the_service(tmp_path):
    """A commit the group refuses (the partitions were reassigned: here one this member
    never got) is a crash between checkpoint and commit, not a reason to exit."""
    async with _joined_service(tmp_path, "refused") as (svc, loop):
        assert loop.consumer is not None
        # A partition this instance believes it owns but the group gave to no one (as
        # after a rebalance this member has not yet heard of): the broker refuses it.
        svc.rack.assign(7, None)
        loop.owned.add(7)
        await svc.durable(loop, {0, 1, 7})  # refused, but no exception
        assert await _checkpointed(loop, 0)
        assert await loop.consumer.committed((loop.topic, 0)) is None  # nothing committed

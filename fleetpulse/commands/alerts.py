"""``fleetpulse alerts tail``: follow the alert topic as a readable table (or JSON lines).

    fleetpulse alerts tail [--config config/detector.toml] [--bootstrap B] [--prefix P]
                           [--json] [--from-beginning] [--idle-exit S] [--job J] [--pages]

Reads with its own throw-away consumer group, so it never moves the detector's offsets.
By default it shows alerts from now on; ``--from-beginning`` replays the topic's history.
A record that does not decode is shown as such and skipped (the tail never dies on bad
input). ``--job J`` shows only the alerts naming workload ``J`` (the detector puts the job
of a GPU alert in its context, detector.workloads) and the incidents they belong to.
``--pages`` leaves out the ``info`` alerts (the forests' signals, which open no incident):
what an on-call person is paged for.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from fleetpulse.config import ConfigError
from schemas.errors import DecodeError
from schemas.records import (
    AlertRecord,
    AlertState,
    IncidentRecord,
    Severity,
    decode_alerts_topic,
)

__all__ = ["format_row", "register", "run"]

HEADER = (f"{'time (UTC)':<19}  {'state':<8}  {'severity':<8}  {'entity':<48}  "
          f"{'source':<22}  {'score/thr':>11}  summary")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("alerts", help="read the alert topic", description=__doc__)
    alerts_sub = p.add_subparsers(dest="alerts_command", metavar="SUBCOMMAND", required=True)
    t = alerts_sub.add_parser("tail", help="follow alerts as a table or JSON lines")
    t.add_argument("--config", type=Path, help="TOML with a [transport] table "
                   "(config/detector.toml works)")
    t.add_argument("--bootstrap", help="Kafka bootstrap (or memory://NAME)")
    t.add_argument("--prefix", help="topic prefix")
    t.add_argument("--json", action="store_true", help="one JSON object per line")
    t.add_argument("--from-beginning", action="store_true", help="replay the topic's history")
    t.add_argument("--job", help="only alerts of this workload (job id or namespace/pod), and "
                   "their incidents")
    t.add_argument("--pages", action="store_true",
                   help="leave out info alerts (signals that page nobody)")
    t.add_argument("--idle-exit", type=float, default=0.0,
                   help="exit after this many seconds without a new alert (0: follow forever)")
    t.set_defaults(func=run)


def format_incident(inc: IncidentRecord) -> str:
    """One incident transition as a table row: the cause, its action, how many alerts."""
    when = datetime.fromtimestamp(inc.updated_ms / 1000.0, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    state = ("merged" if inc.merged_into
             else "INCIDENT" if inc.state is AlertState.FIRING else "ended")
    root = inc.root if len(inc.root) <= 48 else "…" + inc.root[-47:]
    return (f"{when:<19}  {state:<8}  {inc.severity.value:<8}  {root:<48}  "
            f"{'incident ' + inc.id[4:14]:<22}  {len(inc.members):>5} alerts  {inc.summary}")


def format_row(rec: AlertRecord) -> str:
    """One alert as a table row: when, what state, where, why."""
    when = datetime.fromtimestamp(rec.updated_ms / 1000.0, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    state = "FIRING" if rec.state is AlertState.FIRING else "resolved"
    why = rec.summary
    if rec.attribution and rec.source.startswith("model:"):
        why = "; ".join(f"{a.metric.removeprefix('fleetpulse_gpu_')} {a.direction} "
                        f"{a.weight:.0%}" for a in rec.attribution)
    entity = rec.entity if len(rec.entity) <= 48 else "…" + rec.entity[-47:]
    return (f"{when:<19}  {state:<8}  {rec.severity.value:<8}  {entity:<48}  "
            f"{rec.source[:22]:<22}  {rec.score:>5.2f}/{rec.threshold:<5.2f}  {why}")


def _of_job(rec: AlertRecord | IncidentRecord, job: str, shown: set[str]) -> bool:
    """Whether ``rec`` belongs to ``job``: an alert naming it, or an incident of one."""
    if isinstance(rec, IncidentRecord):
        return any(m in shown for m in rec.members)
    if rec.context.get("job") == job:
        shown.add(rec.id)
        return True
    return False


async def _tail(args: argparse.Namespace, out: TextIO) -> int:
    from fleetpulse.commands.topic_reader import transport_from_args
    from schemas.topics import Topics

    transport, cfg = transport_from_args(args)
    await transport.start()
    topics = Topics(cfg.topic_prefix)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    consumer = transport.consumer([topics.alerts], f"fleetpulse-alerts-tail-{uuid.uuid4().hex}",
                                  from_beginning=args.from_beginning)
    if not args.json:
        print(HEADER, file=out, flush=True)
    last = time.monotonic()
    shown: set[str] = set()
    try:
        while not stop.is_set():
            msgs = await consumer.getmany(timeout_ms=300, max_records=500)
            if msgs:
                last = time.monotonic()
            elif args.idle_exit and time.monotonic() - last >= args.idle_exit:
                break
            for msg in msgs:
                try:
                    rec = decode_alerts_topic(msg.value)
                except DecodeError as exc:
                    print(f"# offset {msg.partition}:{msg.offset}: not an alert record: {exc}",
                          file=sys.stderr)
                    continue
                if args.job and not _of_job(rec, args.job, shown):
                    continue
                if args.pages and rec.severity is Severity.INFO:
                    continue
                if args.json:
                    out.write(rec.to_bytes().decode() + "\n")
                elif isinstance(rec, IncidentRecord):
                    out.write(format_incident(rec) + "\n")
                else:
                    out.write(format_row(rec) + "\n")
            out.flush()
    finally:
        await consumer.stop()
        await transport.close()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_tail(args, sys.stdout))
    except ConfigError as exc:
        print(f"alerts: {exc}", file=sys.stderr)
        return 2

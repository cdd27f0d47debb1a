"""The remediation hook: an incident's action as a command, behind a circuit breaker.

Fleets drain and cordon nodes automatically, and the failure to fear is automation that
drains a whole rack because one sensor lied. So the hook acts only on incidents whose root
is one node or GPU, runs the command template configured for the incident's action
(``[remediation]``: ``kubectl cordon {node}``, ``scontrol update nodename={node}
state=drain reason={reason}``...), once per incident and action, and the breaker refuses
when it would act on more than ``max_nodes_per_hour`` distinct nodes within an hour or on
more than ``max_rack_fraction`` of a rack's known nodes within ``rack_window_h``.

Dry-run is the default: the decision is logged and counted, nothing runs. Every decision
(``dry_run``, ``ran``, ``failed``, ``refused_rate``, ``refused_rack``, ``not_node``) is
logged and counted (``fleetpulse_detector_remediation_total{action,outcome}``). Commands
run without a shell, each template argument formatted on its own from validated entity
names, so an entity cannot inject arguments or shell syntax.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections import deque
from dataclasses import dataclass

from detector.config import RemediationConfig
from schemas.records import AlertState, IncidentRecord

__all__ = ["Decision", "RemediationHook"]

log = logging.getLogger(__name__)

_HOUR_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Decision:
    incident: str
    action: str
    node: str
    outcome: str
    command: tuple[str, ...] = ()
    detail: str = ""


class RemediationHook:
    """Decides (and in live mode runs) one command per incident and action."""

    def __init__(self, config: RemediationConfig) -> None:
        self.config = config
        self.templates = {k: shlex.split(v) for k, v in config.templates().items()}
        self.counts: dict[tuple[str, str], int] = {}
        """(action, outcome) -> decisions."""
        self.decisions: deque[Decision] = deque(maxlen=1000)
        self._done: set[tuple[str, str]] = set()
        self._acted: deque[tuple[int, str]] = deque()
        """(time, node path) of every node acted on (or that would have been, dry-run)."""

    @property
    def enabled(self) -> bool:
        return bool(self.templates)

    async def handle(self, inc: IncidentRecord, rack_nodes: int) -> Decision | None:
        """Act on a firing incident if its action has a template; ``rack_nodes``: nodes
        known in the root's rack (the expected senders). None when there is nothing to do."""
        template = self.templates.get(inc.action.value)
        if (template is None or inc.state is not AlertState.FIRING or inc.merged_into
                or (inc.id, inc.action.value) in self._done):
            return None
        self._done.add((inc.id, inc.action.value))
        parts = inc.root.split("/")
        if len(parts) < 4:
            return self._decide(inc, "", "not_node", (),
                                "the root is a rack or larger: not automated")
        node_path, rack_path = "/".join(parts[:4]), "/".join(parts[:3])
        now = inc.updated_ms
        window = int(self.config.rack_window_h * _HOUR_MS)
        while self._acted and now - self._acted[0][0] > max(window, _HOUR_MS):
            self._acted.popleft()
        last_hour = {n for t, n in self._acted if now - t < _HOUR_MS}
        in_rack = {n for t, n in self._acted
                   if now - t < window and n.startswith(rack_path + "/")}
        values = {"cluster": parts[0], "row": parts[1], "rack": parts[2], "node": parts[3],
                  "gpu": parts[4].removeprefix("gpu-") if len(parts) > 4 else "",
                  "incident": inc.id, "action": inc.action.value,
                  "reason": f"fleetpulse {inc.cause} {inc.id}"}
        command = tuple(arg.format(**values) for arg in template)
        if node_path not in last_hour and len(last_hour) >= self.config.max_nodes_per_hour:
            return self._decide(inc, node_path, "refused_rate", command,
                                f"{len(last_hour)} nodes acted on in the last hour")
        limit = max(1, int(self.config.max_rack_fraction * max(rack_nodes, 1)))
        if node_path not in in_rack and len(in_rack) >= limit:
            return self._decide(inc, node_path, "refused_rack", command,
                                f"{len(in_rack)} of the rack's {rack_nodes} nodes acted on")
        self._acted.append((now, node_path))
        if self.config.dry_run:
            return self._decide(inc, node_path, "dry_run", command)
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), self.config.timeout_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                return self._decide(inc, node_path, "failed", command,
                                    f"timed out after {self.config.timeout_s:g} s")
        except OSError as exc:
            return self._decide(inc, node_path, "failed", command, str(exc))
        text = out.decode(errors="replace").strip()[-300:]
        if proc.returncode != 0:
            return self._decide(inc, node_path, "failed", command,
                                f"exit {proc.returncode}: {text}")
        return self._decide(inc, node_path, "ran", command, text)

    def _decide(self, inc: IncidentRecord, node: str, outcome: str, command: tuple[str, ...],
                detail: str = "") -> Decision:
        d = Decision(inc.id, inc.action.value, node, outcome, command, detail)
        key = (d.action, outcome)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.decisions.append(d)
        log.warning("remediation %s: %s on %s for %s: %s%s", outcome, d.action, node or inc.root,
                    inc.id, shlex.join(command), f" ({detail})" if detail else "")
        return d

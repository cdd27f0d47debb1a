"""The deploy files name only flags, config keys and ports that exist.

A manifest is code nobody runs until the night it is needed: a renamed flag or config key,
or a scrape annotation pointing at the wrong port, fails only in production. So every
container command and systemd ExecStart is parsed with the CLI's own argparse, every
embedded TOML is loaded by the component's own loader (unknown keys are errors there), the
environment the files set is applied the same way, and the ports, probes, scrape
annotations and volumes are checked against the configuration that results.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import pytest
import yaml

from agent.config import AgentConfig
from aggregator.config import AggregatorConfig
from detector.config import DetectorConfig
from fleetpulse.cli import build_parser
from fleetpulse.commands import agent as agent_command
from fleetpulse.commands import aggregator as aggregator_command
from fleetpulse.commands import detector as detector_command
from fleetpulse.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
WORKLOADS = {"DaemonSet", "StatefulSet", "Deployment"}


@dataclass(frozen=True)
class Component:
    """How one long-running command is configured, and where it serves /metrics."""

    config_cls: type
    env_prefix: str
    command: ModuleType
    metrics: Callable[[Any], tuple[str, int]]
    """(host, port) that serves /metrics, from the loaded config."""
    data_dirs: Callable[[Any], list[str]]
    """Directories the component writes and that must survive a restart."""


COMPONENTS = {
    "agent": Component(AgentConfig, "FLEETPULSE_AGENT_", agent_command,
                       lambda c: (c.metrics.host, c.metrics.port),
                       lambda c: [str(c.spool.directory)]),
    "aggregator": Component(AggregatorConfig, "FLEETPULSE_AGGREGATOR_", aggregator_command,
                            lambda c: c.host_port, lambda c: [c.data_dir]),
    "detector": Component(DetectorConfig, "FLEETPULSE_DETECTOR_", detector_command,
                          lambda c: (c.metrics_host, c.metrics_port),
                          lambda c: [str(c.state_dir)]),
}


def _component_and_args(argv: list[str]) -> tuple[str, argparse.Namespace]:
    """Which component a command line starts, parsed by the CLI's own parser."""
    exe = PurePosixPath(argv[0]).name
    if exe.startswith("python") and argv[1:3] == ["-m", "agent"]:
        name, rest = "agent", argv[3:]  # python -m agent ARGS = fleetpulse agent ARGS
    else:
        assert exe == "fleetpulse", f"{argv}: neither fleetpulse nor python -m agent"
        name, rest = argv[1], argv[2:]
    assert name in COMPONENTS, f"{argv}: {name} is not a long-running component"
    parser = build_parser(name)
    try:
        args = parser.parse_args([name, *rest])
    except SystemExit:
        pytest.fail(f"{shlex.join(argv)}: the {name} command rejects these flags")
    # argparse also takes a prefix of a flag; a deploy file must spell each one out.
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    spelled = sub.choices[name]._option_string_actions
    for flag in (t.partition("=")[0] for t in rest if t.startswith("--")):
        assert flag in spelled, f"{shlex.join(argv)}: {flag} is not a {name} flag"
    return name, args


def _config(name: str, args: argparse.Namespace, path: Path | None,
            environ: dict[str, str]) -> Any:
    """The configuration the command would run with: file < environment < flags."""
    comp = COMPONENTS[name]
    return load_config(comp.config_cls, path, env_prefix=comp.env_prefix, environ=environ,
                       overrides=comp.command._overrides(args))


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _under(path: str, mounts: list[str]) -> bool:
    return any(PurePosixPath(path).is_relative_to(m) for m in mounts)


def _manifests() -> list[Path]:
    return sorted(DEPLOY.glob("*.yaml"))


def _units() -> list[Path]:
    return sorted(DEPLOY.glob("*.service"))


def test_every_long_running_component_has_a_unit_and_a_manifest() -> None:
    in_units = {_component_and_args(shlex.split(_unit(p)["ExecStart"][0]))[0] for p in _units()}
    in_manifests = {
        _component_and_args(c["command"])[0]
        for p in _manifests() for d in _documents(p) if d["kind"] in WORKLOADS
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert in_units == in_manifests == set(COMPONENTS)
    kinds = {d["kind"] for d in _documents(DEPLOY / "aggregator-statefulset.yaml")}
    assert "StatefulSet" in kinds  # the store needs a stable volume per pod


@pytest.mark.parametrize("manifest", _manifests(), ids=lambda p: p.name)
def test_manifest_flags_keys_ports_and_volumes_exist(manifest: Path, tmp_path: Path) -> None:
    docs = _documents(manifest)
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs
                   if d["kind"] == "ConfigMap"}
    workloads = [d for d in docs if d["kind"] in WORKLOADS]
    assert workloads, f"{manifest.name}: no workload"
    for work in workloads:
        pod = work["spec"]["template"]
        spec = pod["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in work["spec"].get("volumeClaimTemplates", [])}
        for container in spec["containers"]:
            name, args = _component_and_args(container["command"])
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            for mount_name in mounts.values():
                assert mount_name in volumes or mount_name in claims, mount_name

            # --config points into a mounted ConfigMap that has that key, which loads.
            assert args.config is not None, f"{name}: started without --config"
            config_dir = str(PurePosixPath(args.config).parent)
            volume = volumes[mounts[config_dir]]
            toml = config_maps[volume["configMap"]["name"]][args.config.name]
            local = tmp_path / args.config.name
            local.write_text(toml)
            environ = {e["name"]: e.get("value", "from-the-downward-api")
                       for e in container.get("env", [])}
            cfg = _config(name, args, local, environ)

            # /metrics: served on every interface, on the port that is declared and scraped.
            host, port = COMPONENTS[name].metrics(cfg)
            assert host == "0.0.0.0", f"{name}: /metrics on {host} is unreachable from Prometheus"
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert port in ports.values(), f"{name}: /metrics port {port} not declared"
            notes = pod["metadata"]["annotations"]
            assert notes["prometheus.io/scrape"] == "true"
            assert int(notes["prometheus.io/port"]) == port
            assert notes.get("prometheus.io/path", "/metrics") == "/metrics"
            for probe in ("readinessProbe", "livenessProbe"):
                if probe in container:
                    target = container[probe]["httpGet"]["port"]
                    assert target in ports or target in ports.values(), (name, probe)

            # Whatever must survive a restart is on a volume, not the read-only root.
            for path in COMPONENTS[name].data_dirs(cfg):
                assert _under(path, [m for m, v in mounts.items()
                                     if v in claims or "hostPath" in volumes.get(v, {})]), (
                    f"{name}: {path} is not on a persistent volume")
            if container.get("securityContext", {}).get("readOnlyRootFilesystem"):
                cache = environ.get("NUMBA_CACHE_DIR")
                if name != "agent":  # the agent never compiles numba kernels
                    assert cache and _under(cache, list(mounts)), f"{name}: numba cache"
            requests = container["resources"]["requests"]
            assert requests.get("cpu") and requests.get("memory"), name

    services = [d for d in docs if d["kind"] == "Service"]
    for svc in services:
        selected = [w for w in workloads
                    if svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]
                    ["labels"].items()]
        assert selected, f"Service {svc['metadata']['name']} selects nothing"
        named = {p["name"] for w in selected
                 for c in w["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in named, p


def _unit(path: Path) -> dict[str, list[str]]:
    """``key -> values`` of a systemd unit (repeated keys keep every value)."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("unit_path", _units(), ids=lambda p: p.name)
def test_unit_flags_keys_and_directories_exist(unit_path: Path) -> None:
    unit = _unit(unit_path)
    name, args = _component_and_args(shlex.split(unit["ExecStart"][0]))
    assert unit["KillSignal"] == ["SIGTERM"]  # every component drains and commits on SIGTERM
    # The unit's config file is the operator's copy of the sample one; it must be a file
    # the sample configs provide.
    assert args.config is not None and args.config.parent == Path("/etc/fleetpulse")
    sample = ROOT / "config" / args.config.name
    assert sample.exists(), f"{unit_path.name}: no sample {sample.name} in config/"
    environ = dict(v.partition("=")[::2] for v in unit.get("Environment", []))
    cfg = _config(name, args, sample, environ)
    state = [f"/var/lib/{d}" for d in unit.get("StateDirectory", [])]
    for path in COMPONENTS[name].data_dirs(cfg):
        assert _under(path, state), f"{unit_path.name}: {path} outside StateDirectory {state}"
        assert _under(path, unit["ReadWritePaths"][0].split()), path
    if "NUMBA_CACHE_DIR" in environ:
        cache = [f"/var/cache/{d}" for d in unit.get("CacheDirectory", [])]
        assert _under(environ["NUMBA_CACHE_DIR"], cache), "numba cache not writable"
    elif name != "agent":
        pytest.fail(f"{unit_path.name}: ProtectSystem=strict and no NUMBA_CACHE_DIR")


def test_units_and_manifests_agree_on_ports() -> None:
    """A component listens on the same port whether systemd or Kubernetes runs it."""
    ports: dict[str, set[int]] = {}
    for path in _units():
        unit = _unit(path)
        name, args = _component_and_args(shlex.split(unit["ExecStart"][0]))
        environ = dict(v.partition("=")[::2] for v in unit.get("Environment", []))
        cfg = _config(name, args, ROOT / "config" / args.config.name, environ)
        ports.setdefault(name, set()).add(COMPONENTS[name].metrics(cfg)[1])
    for path in _manifests():
        for d in _documents(path):
            if d["kind"] in WORKLOADS:
                notes = d["spec"]["template"]["metadata"]["annotations"]
                (container,) = d["spec"]["template"]["spec"]["containers"]
                name, _ = _component_and_args(container["command"])
                ports.setdefault(name, set()).add(int(notes["prometheus.io/port"]))
    assert all(len(p) == 1 for p in ports.values()), ports
    assert len({next(iter(p)) for p in ports.values()}) == len(ports), "two share a port"

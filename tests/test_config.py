"""Config loading: TOML < environment < overrides, and clear errors naming the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fleetpulse.config import ConfigError, TransportConfig, load_config


@dataclass(frozen=True)
class Sample:
    """A config shaped like a command's."""

    name: str = "x"
    interval_s: float = 1.0
    gpus: tuple[int, ...] = ()
    enabled: bool = True
    transport: TransportConfig = field(default_factory=TransportConfig)

    def validate(self) -> None:
        if self.interval_s < 0.1:
            raise ConfigError("interval_s must be >= 0.1")


def test_layers(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('name = "from-file"\ninterval_s = 2\n[transport]\nbootstrap = "h:1"\n')
    env = {"FP_T_INTERVAL_S": "0.5", "FP_T_TRANSPORT__COMPRESSION": "zstd", "FP_T_GPUS": "1,2",
           "FP_T_ENABLED": "false", "OTHER": "ignored"}
    cfg = load_config(Sample, path, env_prefix="FP_T_", environ=env, overrides={"name": "cli"})
    assert cfg == Sample(name="cli", interval_s=0.5, gpus=(1, 2), enabled=False,
                         transport=TransportConfig(bootstrap="h:1", compression="zstd"))


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("nmae = 1", "unknown keys"),
        ("interval_s = 'fast'", "interval_s"),
        ("interval_s = 0.01", "interval_s must be"),
        ("[transport]\ncompression = 'rar'", "compression"),
        ("[transport]\nsecurity_protocol = 'TLS'", "security_protocol"),
        ("name = [", "c.toml"),
    ],
)
def test_errors_name_the_field(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=message):
        load_config(Sample, path)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Sample, "/nonexistent/fleetpulse.toml")


def test_shipped_aggregator_config_loads_and_rejects_a_negative_settle(tmp_path: Path) -> None:
    from aggregator.config import AggregatorConfig

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(AggregatorConfig, root / "config" / "aggregator.toml",
                      env_prefix="FLEETPULSE_AGGREGATOR_",
                      environ={"FLEETPULSE_AGGREGATOR_ROW_SETTLE_MS": "150000"})
    assert cfg.row_settle_ms == 150_000 and cfg.row_lateness_ms == 300_000
    path = tmp_path / "a.toml"
    path.write_text("row_settle_ms = -1\n")
    with pytest.raises(ConfigError, match="row_settle_ms"):
        load_config(AggregatorConfig, path)

"""The detector's sample config is complete, equal to the defaults, and validated."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from detector.config import DetectorConfig
from fleetpulse.config import ConfigError, load_config

SAMPLE = Path(__file__).resolve().parents[1] / "config" / "detector.toml"


def test_sample_config_loads_and_matches_the_defaults() -> None:
    loaded = load_config(DetectorConfig, SAMPLE)
    assert loaded.transport.client_id == "fleetpulse-detector"
    assert dataclasses.replace(loaded, transport=DetectorConfig().transport) == DetectorConfig()


def test_sample_config_lists_every_field() -> None:
    data = tomllib.loads(SAMPLE.read_text())
    default = DetectorConfig()
    missing = [f.name for f in dataclasses.fields(DetectorConfig) if f.name not in data]
    for table in ("model", "rack", "alerts", "rules", "job_peers", "webhook"):
        missing += [f"{table}.{f.name}" for f in dataclasses.fields(getattr(default, table))
                    if f.name not in data[table]]
    assert not missing


def test_environment_overrides_and_validation() -> None:
    cfg = load_config(DetectorConfig, SAMPLE, env_prefix="FLEETPULSE_DETECTOR_",
                      environ={"FLEETPULSE_DETECTOR_MODEL__Z": "7.5",
                               "FLEETPULSE_DETECTOR_TRANSPORT__BOOTSTRAP": "h:9092"})
    assert cfg.model.z == 7.5 and cfg.transport.bootstrap == "h:9092"
    with pytest.raises(ConfigError, match="node_veto"):
        load_config(DetectorConfig, overrides={"alerts": {"node_veto": 0.0}})
    with pytest.raises(ConfigError, match=r"webhook\.url"):
        load_config(DetectorConfig, overrides={"webhook": {"url": "ftp://x"}})
    with pytest.raises(ConfigError, match=r"model\.step_s"):
        load_config(DetectorConfig, overrides={"model": {"step_s": 0.0}})
    with pytest.raises(ConfigError, match="screen_below"):
        load_config(DetectorConfig, overrides={"model": {"screen_below": 1.5}})
    with pytest.raises(ConfigError, match="shed_after_s"):
        load_config(DetectorConfig, overrides={"shed_after_s": -1.0})
    with pytest.raises(ConfigError, match="admit_within_s"):
        load_config(DetectorConfig, overrides={"admit_within_s": -1.0})
    with pytest.raises(ConfigError, match="unknown keys"):
        load_config(DetectorConfig, overrides={"model": {"treez": 3}})

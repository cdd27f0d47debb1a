"""Configuration: frozen dataclasses loaded from TOML, overridden by the environment.

Every command's settings are a frozen dataclass whose fields carry a docstring and a
default, and which may define ``validate()``. :func:`load_config` fills one from a TOML file
(tables map to nested dataclasses), then from environment variables named
``<PREFIX><FIELD>`` with ``__`` between nesting levels, e.g.
``FLEETPULSE_AGENT_TRANSPORT__BOOTSTRAP=127.0.0.1:9092``. Unknown keys are errors, so a typo
in a config file is caught at start, not at 3 a.m.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["ConfigError", "TransportConfig", "load_config", "transport_overrides"]

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, unknown or invalid; the message names the field."""


@dataclasses.dataclass(frozen=True, slots=True)
class TransportConfig:
    """How a stage reaches its topics. SASL/SSL settings are passed through to aiokafka."""

    bootstrap: str = "memory://"
    """``memory://NAME`` for the embedded in-process broker, else Kafka ``host:port[,...]``."""
    topic_prefix: str = "fleetpulse"
    """Prefix of every topic name (DESIGN.md: fleetpulse.samples, ...)."""
    client_id: str = "fleetpulse"
    compression: str = "lz4"
    """Producer compression: lz4, zstd, gzip, snappy or none."""
    security_protocol: str = "PLAINTEXT"
    """PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."""
    sasl_mechanism: str = "PLAIN"
    """PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (used only with SASL_*)."""
    sasl_username: str = ""
    sasl_password: str = ""
    ssl_cafile: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    request_timeout_ms: int = 30_000
    """How long one produce or fetch may take before it fails (and the agent spools)."""

    @property
    def is_memory(self) -> bool:
        return self.bootstrap.startswith("memory://")

    def validate(self) -> None:
        if self.compression not in {"lz4", "zstd", "gzip", "snappy", "none"}:
            raise ConfigError(f"transport.compression: unknown codec {self.compression!r}")
        protocols = {"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}
        if self.security_protocol not in protocols:
            raise ConfigError(
                f"transport.security_protocol must be one of {sorted(protocols)}, "
                f"got {self.security_protocol!r}"
            )
        if not self.is_memory and not self.bootstrap.strip():
            raise ConfigError("transport.bootstrap is empty")


def transport_overrides(**flags: str | None) -> dict[str, Any]:
    """The ``transport`` table of command-line overrides: only the flags that were given.

    Keys are TransportConfig field names; load_config rejects any other, so a command
    cannot pass a misspelt one silently.
    """
    return {key: value for key, value in flags.items() if value}


def _convert(value: Any, tp: Any, where: str) -> Any:
    """Coerce a TOML or environment value to the annotated type, or raise ConfigError."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (value == "" and type(None) in typing.get_args(tp)):
            return None
        return _convert(value, args[0], where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a table")
        return _build(tp, value, where)  # type: ignore[arg-type]
    if origin is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ConfigError(f"{where}: expected a list")
        (item_tp, *_rest) = typing.get_args(tp)
        return tuple(_convert(v.strip() if isinstance(v, str) else v, item_tp, where)
                     for v in items if v != "")
    try:
        if tp is bool:
            if isinstance(value, str):
                if value.lower() not in {"1", "0", "true", "false", "yes", "no"}:
                    raise ValueError(value)
                return value.lower() in {"1", "true", "yes"}
            if not isinstance(value, bool):
                raise ValueError(value)
            return value
        if tp is int and not isinstance(value, bool):
            return int(value)
        if tp is float and not isinstance(value, bool):
            return float(value)
        if tp is str:
            if not isinstance(value, str):
                raise ValueError(value)
            return value
        if tp is Path:
            return Path(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {value!r} is not a valid {getattr(tp, '__name__', tp)}") from None
    raise ConfigError(f"{where}: unsupported type {tp}")


def _build(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - set(fields)
    if unknown:
        raise ConfigError(f"{where or 'config'}: unknown keys {sorted(unknown)}")
    kwargs = {
        name: _convert(value, hints[name], f"{where}.{name}" if where else name)
        for name, value in data.items()
    }
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


def _env_tree(prefix: str, environ: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith(prefix):
            continue
        parts = key[len(prefix):].lower().split("__")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return tree


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    *,
    env_prefix: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> T:
    """Build ``cls`` from defaults < TOML file < environment < ``overrides`` (CLI flags)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from exc
    if env_prefix:
        data = _merge(data, _env_tree(env_prefix, os.environ if environ is None else environ))
    if overrides:
        data = _merge(data, overrides)
    return _build(cls, data, "")

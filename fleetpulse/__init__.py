"""fleetpulse runtime: transports, configuration, the CLI and the all-in-one runner."""

__version__ = "0.1.0"

"""Subcommands of ``fleetpulse``; see :mod:`fleetpulse.cli` for the convention."""

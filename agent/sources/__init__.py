"""Agent inputs. Each module registers itself by name; open one with
:func:`agent.sources.base.open_source` (the built-ins are imported on demand)."""

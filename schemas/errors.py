"""The one error type that every decoder in :mod:`schemas` raises.

Consumers catch exactly this (never a bare ``Exception``) to route a message to the
dead-letter topic, so a bug in our own code still crashes loudly instead of being
mistaken for bad input.
"""

from __future__ import annotations

__all__ = ["DecodeError"]


class DecodeError(ValueError):
    """Bytes that are not a valid fleetpulse record; the message says what is wrong.

    ``retriable`` is always False: the same bytes will fail the same way again.
    """

    retriable = False

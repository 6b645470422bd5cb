"""The one error a config that cannot be used raises, whatever part of the tree finds it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the key."""

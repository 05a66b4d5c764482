"""The error a ``perfdb`` subcommand raises for a mistake in how it was called.

Its own module, below the subcommands and ``cli``, so that a subcommand raises it without
importing the console script that imports the subcommands.
"""

from __future__ import annotations


class UsageError(Exception):
    """A mistake in how a command was called (conflicting or missing arguments)."""

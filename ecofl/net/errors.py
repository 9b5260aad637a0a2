"""What can go wrong on a home's network channels, as errors every layer above catches by name.

A peer that does not prove the home's secret is :class:`AuthenticationFailed`
(a ``RuntimeError``: the peer was reached, it is not one of the home's); a
connection that ends, breaks or fails a record's tag is :class:`ChannelClosed`
(a ``ConnectionError``, so an ``OSError`` too).
"""

from __future__ import annotations


class AuthenticationFailed(RuntimeError):
    """A peer did not prove it holds the home's secret (or the acceptor did not)."""


class ChannelClosed(ConnectionError):
    """The peer closed the connection, it broke, or a record failed its authentication tag."""

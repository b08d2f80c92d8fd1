"""Errors of the state layer. Each says what went wrong with which state and what to do."""

from __future__ import annotations

from streamsnap.errors import StreamsnapError


class StateError(StreamsnapError, RuntimeError):
    """State was used in a way that cannot work (no current key, kind mismatch, disposed...)."""


class StateSerializationError(StateError, TypeError):
    """A state value or key cannot be encoded by the state's serializer."""

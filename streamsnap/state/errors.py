"""Errors of the state layer. Each says what went wrong with which state and what to do."""

from __future__ import annotations

from streamsnap.errors import DataError, StreamsnapError


class StateError(StreamsnapError, RuntimeError):
    """State was used in a way that cannot work (no current key, kind mismatch, disposed...)."""


class StateSerializationError(StateError, DataError, TypeError):
    """A state value or key cannot be encoded by the state's serializer (or decoded on restore).

    A DataError: the replay after a restart writes the same value again, so the job fails at
    once instead of spending its restart budget."""

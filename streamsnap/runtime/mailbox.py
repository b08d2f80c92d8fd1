"""The task mailbox: actions for the task's single processing thread (Flink's TaskMailbox).

Everything that changes a task's state — control messages from the driver — is queued here
and executed by the mailbox thread between batches, so operators and state are never touched
by two threads. Putting a mail wakes the task thread wherever it sleeps (in the network
poller's `select`, see `network.poller`).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable


class Mailbox:
    def __init__(self, waker: Callable[[], None]):
        self._mails: deque[Any] = deque()
        self._waker = waker

    def put(self, mail: Any) -> None:
        """Queue a mail (any thread) and wake the task thread."""
        self._mails.append(mail)
        self._waker()

    def take_all(self) -> list[Any]:
        mails = []
        while self._mails:
            mails.append(self._mails.popleft())
        return mails

    def has_mail(self) -> bool:
        return bool(self._mails)

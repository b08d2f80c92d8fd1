"""The task mailbox: actions for the task's single processing thread (Flink's TaskMailbox).

Everything that changes a task's state — control messages from the driver, the end of an
asynchronous snapshot — is queued here and executed by the mailbox thread between batches, so
operators and state are never touched by two threads. The same condition variable wakes the
thread when input arrives or output capacity frees up, without lost wake-ups.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any


class Mailbox:
    def __init__(self) -> None:
        self._mails: deque[Any] = deque()
        self._cond = threading.Condition()
        self._signalled = False

    def put(self, mail: Any) -> None:
        with self._cond:
            self._mails.append(mail)
            self._signalled = True
            self._cond.notify()

    def wake(self) -> None:
        """Something other than a mail happened (input arrived, output drained)."""
        with self._cond:
            self._signalled = True
            self._cond.notify()

    def take_all(self) -> list[Any]:
        if not self._mails:
            return []
        with self._cond:
            mails = list(self._mails)
            self._mails.clear()
            return mails

    def has_mail(self) -> bool:
        return bool(self._mails)

    def wait(self, timeout: float | None) -> None:
        """Sleep until a mail or wake-up arrives (or `timeout` seconds pass)."""
        with self._cond:
            if not self._signalled and not self._mails:
                self._cond.wait(timeout)
            self._signalled = False

"""Evidence written after a decision: in order, retried while the ledger is away, never holding up the route.

Before a rollout decides, a ledger that cannot take its evidence stops the rollout: nothing may be
decided on evidence an auditor will not find. Once the decision's route write has committed, the
route is the truth and the evidence follows it. From then on every write goes to an outbox that one
thread drains in order: a ledger that is down (or slow) holds the writes back, never the rollback
window, the drain of the old stable or a revert. When the ledger is back, the held writes land in
the order they were made, the run's close last, so the run ends with the decision the route states.

A write that fails while the ledger answers is broken, not held: it is tried a few times, then
dropped and named, so one bad write cannot keep the run open for ever.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

BROKEN_TRIES = 3  # a write that fails this often while the ledger answers is dropped (and named)


@dataclass(frozen=True)
class Held:
    """One write the outbox holds: what it is, in a few words, and the call that makes it."""

    what: str
    write: Callable[[], object]


class EvidenceOutbox:
    """Writes straight through until :meth:`defer`; after it, queued and written in order by a thread of its own.

    ``reachable`` asks the ledger whether it answers at all (a cheap read), so a failed write tells an
    outage from a broken write. ``say`` reports an outage once when it starts and once when it ends.
    """

    def __init__(self, reachable: Callable[[], bool], *, say: Callable[[str], None] = print,
                 backoff_s: tuple[float, float] = (0.5, 5.0)) -> None:
        self.reachable = reachable
        self.say = say
        self.backoff_s = backoff_s
        self._queue: deque[Held] = deque()
        self._changed = threading.Condition()
        self._deferring = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self.dropped: list[str] = []  # broken writes given up on, by name
        self.outages = 0  # how many times the ledger went away while writes were held

    @property
    def deferring(self) -> bool:
        """Whether writes are queued now (after the decision's commit)."""
        return self._deferring

    def defer(self) -> None:
        """From now on, queue every write: the decision stands whatever the ledger does."""
        self._deferring = True

    def write(self, what: str, call: Callable[[], object]) -> None:
        """Make the write ``call`` now (before :meth:`defer`: its error is the caller's), or queue it."""
        if not self._deferring:
            call()
            return
        with self._changed:
            self._queue.append(Held(what, call))
            if self._thread is None:
                self._thread = threading.Thread(target=self._drain, name="evidence-outbox", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def pending(self) -> tuple[str, ...]:
        """What is still held, in order."""
        with self._changed:
            return tuple(held.what for held in self._queue)

    def wait(self, limit_s: float) -> tuple[str, ...]:
        """Wait up to ``limit_s`` for every held write to land; what is still held after (empty: all written)."""
        deadline = time.monotonic() + limit_s
        with self._changed:
            while self._queue and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(min(left, 1.0))
            return tuple(held.what for held in self._queue)

    def flush(self, limit_s: float) -> tuple[str, ...]:
        """:meth:`wait`, then stop the writer thread: what never landed (empty: all written)."""
        left = self.wait(limit_s)
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        return left

    def _drain(self) -> None:
        delay, tries, away_since = self.backoff_s[0], 0, 0.0
        while True:
            with self._changed:
                while not self._queue and not self._closing:
                    self._changed.wait()
                if self._closing:
                    return
                held = self._queue[0]
            try:
                held.write()
            except Exception as error:  # the ledger's client raises its own types for outages and refusals alike
                if self._ledger_answers():
                    tries += 1
                    if tries < BROKEN_TRIES:
                        continue
                    self.say(f"evidence write {held.what!r} failed {tries} times while the ledger answers "
                             f"({type(error).__name__}: {error}); dropped, the run's other evidence follows")
                    self.dropped.append(held.what)
                else:
                    if not away_since:
                        away_since = time.monotonic()
                        self.outages += 1
                        self.say(f"the evidence ledger is unreachable ({type(error).__name__}); "
                                 f"{len(self.pending())} evidence writes held in order and retried; "
                                 "the route's decision stands")
                    self._pause(delay)
                    delay = min(delay * 2, self.backoff_s[1])
                    continue
            if away_since:
                self.say(f"the evidence ledger is back after {time.monotonic() - away_since:.0f} s; "
                         "the held evidence is being written")
                away_since = 0.0
            delay, tries = self.backoff_s[0], 0
            with self._changed:
                self._queue.popleft()
                self._changed.notify_all()

    def _ledger_answers(self) -> bool:
        try:
            return bool(self.reachable())
        except Exception:
            return False

    def _pause(self, seconds: float) -> None:
        with self._changed:
            if not self._closing:
                self._changed.wait(seconds)

"""When the group commit's next flush is due (:mod:`.group_commit`; docs/storage-layout.md,
"The flush interval").

A flush is due ``flush_linger_ms`` after the first batch queued for it, and -- so that a steady
stream makes at most ``3600 s / flush_interval_ms`` flushes an hour (two PUTs each) -- no sooner
than the flush interval's token bucket allows (:data:`FLUSH_BURST` flushes may follow one
another after their linger alone; one more every interval). Two kinds of flush do not wait
for the bucket, because waiting would cost more than the PUTs it saves:

* **A big queue**: from :data:`INTERVAL_EXEMPT_BYTES` (1 MiB) of payload the flush's two PUTs
  cost less than storing its bytes for a month.
* **A stalled queue** (the adaptive part, issue 18): at least ``flush_idle_min_bytes`` queued,
  and no batch queued for ``flush_idle_ms``. Kafka producers keep a bounded window of
  requests unanswered (``max.in.flight.requests.per.connection``, 5 for the Java client and
  for idempotent librdkafka); with acks=all a Produce is answered after the flush that
  commits it, so once a producer's window is full it sends nothing more until that flush.
  A queue that stopped growing is such a queue: waiting for the interval would only make
  its producers wait, not the flush bigger (a producer of 5 requests of 16 KB was held to
  0.6 MB/s by the 500 ms interval). Such an early flush comes no sooner than
  ``flush_min_interval_ms`` after the previous flush took the queue, so the flushes it adds
  are at most ``1 / flush_min_interval_ms`` a second, and none at all for a trickle that
  queues less than ``flush_idle_min_bytes`` per interval: a trickle's PUTs stay what the
  interval makes them. Early flushes are on only while ``flush_min_interval_ms <
  flush_interval_ms``.

Neither kind takes a token of the bucket: a fast stream's small tail commits after its
linger, not a bucket's worth of intervals later.

Object-store brokers face the same trade: WarpStream's agents flush on a fixed
``batchTimeout`` (250 ms by default, 50 ms at the least, "higher PUT request API fees") and
ask clients for more concurrent requests (Little's law); the stalled-queue rule instead
detects the clients' window being full and flushes then, within the same kind of floor.
"""

from __future__ import annotations

import time
from typing import Callable

from .requests import BrokerConfig

#: flushes that may follow one another after their linger alone before ``flush_interval_ms``
#: spaces them (a token bucket of this many flushes, one more every interval): a burst of
#: writes -- a script, a test, a batch every minute -- is not held back; a steady stream is
#: held to one flush per interval, so at most ``3600 s / interval + FLUSH_BURST`` an hour
FLUSH_BURST = 10
#: payload bytes from which a queued flush no longer waits for ``flush_interval_ms`` (only for its
#: linger): from 1 MiB a flush's two PUTs cost less than storing what it writes for a month
#: (S3 list prices: $0.005 per 1 000 PUTs, $0.023 per GB-month), and a fast stream -- whose
#: idempotent producers keep at most 5 batches in flight per partition -- is not slowed to 5
#: batches per interval
INTERVAL_EXEMPT_BYTES = 1024 * 1024


class FlushSchedule:
    """The flush timing of one group commit: the queue's size and age, the interval's bucket.

    Args:
        config: ``flush_linger_ms``, ``flush_interval_ms``, ``flush_min_interval_ms``,
            ``flush_idle_ms`` and ``flush_idle_min_bytes`` (:class:`~.requests.BrokerConfig`).
        clock: monotonic seconds (tests inject one; :func:`time.monotonic` by default).

    Not thread-safe: the group commit calls it under its lock.
    """

    def __init__(self, config: BrokerConfig, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.clock = clock
        #: payload bytes queued for the next flush
        self.pending_bytes = 0
        self._first_at = 0.0  # when the first batch of the queue was queued (monotonic s)
        self._last_at = 0.0  # when the latest one was
        self._queued = 0  # batches queued
        #: when the previous flush took the queue (monotonic s)
        self._taken_at = float("-inf")
        #: the flush interval's bucket (GCRA's "theoretical arrival time", monotonic s): a flush
        #: that only its linger ends may take the queue from ``_interval_tat - (FLUSH_BURST - 1)
        #: * interval`` on; each flush the interval governs moves it one interval on
        self._interval_tat = float("-inf")

    def queued(self, nbytes: int) -> bool:
        """A batch of ``nbytes`` payload bytes was queued. Returns whether it made the flush due
        sooner than a flusher sleeping on :meth:`due_at` expects (the queue crossed
        :data:`INTERVAL_EXEMPT_BYTES` or ``flush_idle_min_bytes``): the caller wakes it."""
        now = self.clock()
        if not self._queued:
            self._first_at = now
        self._queued += 1
        self._last_at = now
        before, self.pending_bytes = self.pending_bytes, self.pending_bytes + nbytes
        return any(before < threshold <= self.pending_bytes
                   for threshold in (INTERVAL_EXEMPT_BYTES, self.config.flush_idle_min_bytes))

    def due_at(self) -> float:
        """When (monotonic s) the queued batches' flush is due if nobody asks for it sooner (the
        rules of the module docstring). Meaningless while nothing is queued."""
        cfg = self.config
        linger_end = self._first_at + cfg.flush_linger_ms / 1000
        if self.pending_bytes >= INTERVAL_EXEMPT_BYTES:
            return linger_end
        interval = cfg.flush_interval_ms / 1000
        return min(max(linger_end, self._interval_tat - (FLUSH_BURST - 1) * interval), self._stalled_at())

    def _stalled_at(self) -> float:
        """When the queue may go as a stalled one (monotonic s; inf: it may not): its linger over,
        ``flush_idle_ms`` after its last batch, ``flush_min_interval_ms`` after the previous flush."""
        cfg = self.config
        if cfg.flush_min_interval_ms >= cfg.flush_interval_ms or self.pending_bytes < cfg.flush_idle_min_bytes:
            return float("inf")
        return max(self._first_at + cfg.flush_linger_ms / 1000, self._last_at + cfg.flush_idle_ms / 1000,
                   self._taken_at + cfg.flush_min_interval_ms / 1000)

    def governed(self) -> bool:
        """Whether a flush taking the queue now is one the interval governs: it takes a token of
        the bucket (False: a big queue, or a stalled one the minimum interval lets go now;
        :meth:`taken` leaves the bucket alone for them)."""
        return self.pending_bytes < INTERVAL_EXEMPT_BYTES and self.clock() < self._stalled_at()

    def taken(self) -> int:
        """A flush took the queue (whatever made it due: the caller also takes urgent and full
        queues): updates the bucket and the queue's state. Returns the payload bytes taken."""
        now = self.clock()
        if self.governed():
            # a flush the interval governs takes a token of the bucket; a big or a stalled one does
            # not, so a fast stream's big flushes never make its small tail wait: the bucket is never
            # more than FLUSH_BURST intervals ahead of now (a fast stream of 20 big flushes used to
            # push it 10 s ahead, and the stream's last, small flush waited those 10 s)
            interval = self.config.flush_interval_ms / 1000
            self._interval_tat = min(max(self._interval_tat, now) + interval, now + FLUSH_BURST * interval)
        self._taken_at = now
        taken, self.pending_bytes, self._queued = self.pending_bytes, 0, 0
        return taken

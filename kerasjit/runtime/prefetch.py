"""Batches drawn ahead on a second thread while the step computes.

Gathering a shuffled batch takes as long as a small model's step, and both
run with the GIL released, so a second core overlaps them
(reports/tuning-measurements.md). The first batch is drawn on the calling
thread, where Keras draws the epoch's shuffle from numpy's global RNG. Batches
come in the source's order; a source's exception reaches the consumer in its place.
"""
import queue
import threading

_POLL_S = 0.01      # how soon the thread of a closed Prefetcher ends


class Prefetcher:
    """An iterator over `source`, reading up to `ahead` items ahead on a daemon
    thread from the second item on. The thread ends with the source, or once
    this object is closed or collected (Keras may stop an epoch early)."""

    def __init__(self, source, ahead=1):
        self._source, self._ahead = iter(source), ahead
        self._queue = self._thread = None
        self._closed = threading.Event()

    def __iter__(self):
        return self

    def __next__(self):
        if self._queue is None:
            item = next(self._source)
            self._queue = queue.Queue(maxsize=self._ahead)
            self._thread = threading.Thread(
                target=_produce, args=(self._source, self._queue, self._closed),
                name="kerasjit-prefetch", daemon=True)
            self._thread.start()
            return item
        if self._closed.is_set():             # (no thread left to wait for)
            raise StopIteration
        kind, value = self._queue.get()
        if kind == "item":
            return value
        self._queue.put((kind, value))        # ended: later calls end the same way
        if kind == "end":
            raise StopIteration
        raise value

    def close(self):
        """Stop drawing and wait for the thread (at most the item it is drawing)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join()

    def __del__(self):
        self._closed.set()


def _produce(source, out, closed):
    """Move `source`'s items (then its end or its exception) into `out`. Holds
    no reference to the Prefetcher, so that dropping it closes this thread."""
    def put(entry):
        while not closed.is_set():
            try:
                out.put(entry, timeout=_POLL_S)
                return True
            except queue.Full:
                pass
        return False
    try:
        for item in source:
            if not put(("item", item)):
                return
        put(("end", None))
    except BaseException as error:    # (the consumer raises it; never left waiting)
        put(("error", error))

"""Compiled code gives the same bits whatever number of threads runs it."""
import numpy as np

from kerasjit.backends.cpu import parallel


def identical_on_any_thread_count(executable, args, counts=(1, 2, 7)):
    """`executable`'s outputs on `args`, checked bit-identical when run on
    each of `counts` threads (7: more parts than cores, uneven rows): a
    reduction's parts are fixed, not the thread count."""
    results = []
    for threads in counts:
        parallel.set_threads(threads)
        results.append(executable(list(args)))
    for got in results[1:]:
        assert all(np.array_equal(g, w) for g, w in zip(got, results[0]))
    return results[0]

"""The worker's watch on Python's cyclic collector (worker/collector.py), on this process's own collector."""
import gc

from jevany_daemon.worker.collector import CollectorWatch


def test_each_collection_is_counted_in_its_generation_with_its_time_and_none_after_close():
    watch = CollectorWatch()
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
        seen = watch.as_dict()
    finally:
        watch.close()
    # the process's own collections may add to generation 0 meanwhile, never take away
    assert seen["collections"][0] >= 1 and seen["collections"][2] == 2
    assert seen["seconds"][2] > 0 and seen["longest_ms"] > 0
    gc.collect(2)
    assert watch.as_dict()["collections"][2] == 2 and watch._observe not in gc.callbacks

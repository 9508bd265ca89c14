"""JevModel batches callers from several threads into shared passes, with the answers of serial scoring.

The first caller's pass is held inside attention until the other callers have handed their requests
to the model, so they certainly arrive while the model is busy: group commit must then take them
together in the next pass.
"""
import threading

import torch.nn.functional as F

from jevany_daemon import workloads
from jevany_daemon.inprocess import JevModel
from jevany_daemon.parity import compare

CALLERS = 6


def test_callers_on_several_threads_share_passes(tiny_model, monkeypatch):
    model = JevModel.load(str(tiny_model("qwen3", "pointer")), max_batch_size=8, batch_policy="greedy",
                          max_padding_waste=1.0)
    bodies = workloads.short(CALLERS, seed=61)
    serial = [model.decide_body(b) for b in bodies]
    assert {r["batch"]["size"] for r in serial} == {1}

    first_pass_running, release = threading.Event(), threading.Event()
    real_attention = F.scaled_dot_product_attention

    def held_attention(*args, **kwargs):
        if not release.is_set():
            first_pass_running.set()
            release.wait(60)
        return real_attention(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", held_attention)
    handed = threading.Semaphore(0)
    pending = model.engine.pending

    def pending_then_tell(admitted):       # the caller's request is ready to queue
        try:
            return pending(admitted)
        finally:
            handed.release()

    monkeypatch.setattr(model.engine, "pending", pending_then_tell)
    results: dict[int, dict] = {}

    def call(i: int) -> None:
        results[i] = model.decide_body(bodies[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(CALLERS)]
    threads[0].start()
    assert first_pass_running.wait(60)
    for t in threads[1:]:
        t.start()
    for _ in range(CALLERS):
        assert handed.acquire(timeout=60)
    release.set()
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    sizes = [results[i]["batch"]["size"] for i in range(CALLERS)]
    assert sizes[0] == 1 and max(sizes[1:]) > 1, sizes          # the later callers shared a pass
    report = compare(serial, [results[i] for i in range(CALLERS)])
    assert report["max_abs_diff"] <= 1e-5 and report["decisions_changed"] == []

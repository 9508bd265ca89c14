"""The order in which a pass's download is queued on CUDA, checked without a GPU.

No GPU here, so torch.cuda's events and streams are replaced by fakes that
record what was queued on which device's stream. What is checked is the
ordering the host asks for; CUDA keeps it (one stream per device runs in
order, and a stream that waits for an event runs nothing after until it
fires).

And the simulated accelerator's timing (SimulatedStream, the CPU stream with a device's pace).
"""
import pytest
import torch

from jevany_daemon.engine import stream as stream_module
from jevany_daemon.engine.stream import Mark, SimulatedStream, Stream


class Queued:
    """What was queued, in order: (what, device index, event id)."""

    def __init__(self):
        self.log, self.events = [], 0

    def fakes(self):
        queued = self

        class FakeStream:
            def __init__(self, device):
                self.index = torch.device(device).index

            def wait_event(self, event):
                queued.log.append(("wait", self.index, event.id))

        class FakeEvent:
            def __init__(self, enable_timing=False):
                queued.events += 1
                self.id = queued.events

            def record(self, on=None):
                # no stream given: the current device's, cuda:0 in a worker
                queued.log.append(("record", 0 if on is None else on.index, self.id))

        class FakeHost:
            def copy_(self, source, non_blocking=False):
                assert non_blocking
                queued.log.append(("copy", source.device.index, None))

        return FakeStream, FakeEvent, FakeHost


class Probabilities:
    """What download() reads of the pass's probabilities: where they are, their shape and dtype."""

    def __init__(self, device):
        self.device, self.shape, self.dtype = torch.device(device), (6,), torch.float32


@pytest.fixture
def queued(monkeypatch):
    q = Queued()
    fake_stream, fake_event, fake_host = q.fakes()
    monkeypatch.setattr(torch.cuda, "Event", fake_event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: fake_stream(device))
    monkeypatch.setattr(stream_module.torch, "empty", lambda *args, **kwargs: fake_host())
    return q


def test_on_one_gpu_the_event_wait_syncs_on_follows_the_copy(queued):
    ticket = Stream(torch.device("cuda:0")).download(Probabilities("cuda:0"), Mark(0.0))
    assert queued.log == [("copy", 0, None), ("record", 0, ticket.event.id)]


def test_on_a_spread_model_the_first_gpus_event_waits_for_the_copy_on_the_last(queued):
    # The pass began on cuda:0 (the embedding's); its probabilities came out on cuda:1 (the final norm's).
    ticket = Stream(torch.device("cuda:0")).download(Probabilities("cuda:1"), Mark(0.0))
    [copy, copied, wait, done] = queued.log
    assert copy == ("copy", 1, None)
    assert copied[:2] == ("record", 1) and wait == ("wait", 0, copied[2])
    assert done == ("record", 0, ticket.event.id)        # where began's event is: elapsed_time pairs them


def test_the_simulated_device_runs_one_pass_at_a_time_so_back_to_back_passes_end_a_pass_apart():
    # Two passes handed over at once queue on the one device: the second is ready pass_s after the first is,
    # two pass_s after the first began, not pass_s after it was handed over (as if it ran alongside the first).
    # pass_s is long and nothing is waited for: the times are read off the tickets, not measured.
    pass_s = 60.0
    stream = SimulatedStream(torch.device("cpu"), pass_s)
    first = stream.download(torch.tensor([0.25, 0.75]), stream.begin())
    second = stream.download(torch.tensor([0.5, 0.5]), stream.begin())
    assert first.ready_at == pytest.approx(first.handed_at + pass_s)
    assert second.ready_at == pytest.approx(first.ready_at + pass_s)
    assert second.ready_at - first.handed_at >= 2 * pass_s

"""The device as a pass sees it: one copy in, kernels queued, one copy out.

On CUDA the host only queues work; it waits for the device at the first
exchange that needs a device value, and a pass that exchanges in the middle
(a blocking copy, ``.item()``, ``if tensor:``) idles the device while the
host catches up. So every pass talks to the device through a stream:

- ``upload``: the pass's host-built integer inputs, packed into one pinned
  buffer and copied with one non-blocking copy, before any kernel of the
  pass is queued;
- ``fill``: the same, into a static buffer the pass's forward reads (a
  bucket of the shape plan, replay.py), so a captured graph finds its
  inputs where it recorded them;
- ``download``: the pass's probabilities, copied into pinned memory without
  waiting; the host goes on (admitting, forming the next pass, shaping the
  last one's answers) until ``wait`` takes them: the pass's one sync.

On the CPU all three are immediate. ``SimulatedStream`` is a CPU stream that
behaves like an accelerator for benchmarks and tests: a pass's results are
ready only a fixed time after the previous pass's, and ``wait`` sleeps (the
GIL released) until then, so host work overlapped with it is free, as on a
GPU, while what the host pays in dispatch stays real.
"""
import threading
import time
from array import array
from dataclasses import dataclass, field

import torch


@dataclass
class Mark:
    """Where a pass began: host time, and on CUDA an event queued before its first kernel."""
    host: float
    event: object = None


@dataclass
class Ticket:
    """Probabilities on their way to the host."""
    host: torch.Tensor
    began: Mark
    handed_at: float            # host time when the pass's last op was queued
    event: object = None        # a CUDA event recorded after the copy
    ready_at: float = 0.0       # SimulatedStream: when the device would finish
    used: int | None = None     # how many leading values the host reads (a fixed layout's), None: all


@dataclass
class Counters:
    uploads: int = 0
    downloads: int = 0
    waited_s: float = 0.0       # host time spent waiting for the device

    def as_dict(self) -> dict:
        return {"uploads": self.uploads, "downloads": self.downloads, "waited_s": round(self.waited_s, 4)}


class Stream:
    def __init__(self, device: torch.device):
        self.device = device
        # The host is free while the device runs: on CUDA (kernels are queued, the host waits only in
        # wait), and on the simulated accelerator. The worker overlaps its passes there, the batch
        # policy stops timing lone requests, and a stem is recomputed in rows before it costs a pass.
        self.asynchronous = device.type == "cuda"
        self.count = Counters()
        self._lock = threading.Lock()     # in-process callers run passes on their own threads

    def counters(self) -> dict:
        return self.count.as_dict()

    def begin(self) -> Mark:
        """Mark the start of a pass, before its upload."""
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return Mark(time.perf_counter(), event)
        return Mark(time.perf_counter())

    def upload(self, *arrays: list[int]) -> list[torch.Tensor]:
        """Flat int64 lists → 1-D device tensors, in one host-to-device copy."""
        with self._lock:
            self.count.uploads += 1
        sizes = [len(a) for a in arrays]
        buffer = array("q")
        for a in arrays:
            buffer.extend(a)
        flat = torch.frombuffer(buffer, dtype=torch.long) if buffer else torch.empty(0, dtype=torch.long)
        if self.device.type == "cuda":
            flat = flat.pin_memory().to(self.device, non_blocking=True)
        elif self.device.type != "cpu":
            flat = flat.to(self.device)
        return list(flat.split(sizes))

    def fill(self, static: torch.Tensor, values: list[int]) -> None:
        """A pass's int64 inputs into a static buffer of exactly their length, in one host-to-device copy."""
        with self._lock:
            self.count.uploads += 1
        host = torch.frombuffer(array("q", values), dtype=torch.long)
        if static.device.type == "cuda":
            host = host.pin_memory()
        # Queued on the stream, after whatever read the buffer before: a pass in flight keeps its inputs.
        static.copy_(host, non_blocking=static.device.type == "cuda")

    def download(self, probs: torch.Tensor, began: Mark, used: int | None = None) -> Ticket:
        """Start the copy of a pass's probabilities (fp32, 1-D) to the host; nothing waits yet.

        used: how many leading values the host will read (the rest pads a fixed layout)."""
        with self._lock:
            self.count.downloads += 1
        if self.device.type != "cuda" or probs.device.type != "cuda":
            return Ticket(probs.detach().to("cpu"), began, time.perf_counter(), used=used)
        host = torch.empty(probs.shape, dtype=probs.dtype, pin_memory=True)
        host.copy_(probs, non_blocking=True)        # queued on the stream of probs' device
        if probs.device != self.device:
            # A model spread over GPUs gives its probabilities on its last GPU, where the copy runs, and
            # the pass's events are on its first (where began is, for elapsed_time): the first GPU's
            # stream waits for the copy, so the event that wait() syncs on comes after it. Without
            # this, wait() could read the host buffer before the copy had landed.
            copied = torch.cuda.Event()
            copied.record(torch.cuda.current_stream(probs.device))
            torch.cuda.current_stream(self.device).wait_event(copied)
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return Ticket(host, began, time.perf_counter(), event, used=used)

    def wait(self, ticket: Ticket) -> tuple[list[float], float]:
        """The pass's one sync: its probabilities on the host, and the seconds the pass took.

        On the CPU a pass is done when its last op returns; on CUDA its time
        is the device's, between its events.
        """
        if ticket.event is None:
            return _read(ticket), ticket.handed_at - ticket.began.host
        started = time.perf_counter()
        ticket.event.synchronize()
        self.count.waited_s += time.perf_counter() - started
        return _read(ticket), ticket.began.event.elapsed_time(ticket.event) / 1000

    def synchronize(self) -> None:
        """Wait for everything queued (start-up and tests only, never on a pass's path)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class SimulatedStream(Stream):
    """A CPU stream with an accelerator's timing: each pass takes ``pass_s`` on a device of its own.

    The device runs one pass at a time: a pass's results are ready pass_s
    after it was handed over or after the previous pass was done, whichever
    is later. Handing over is the download of its probabilities, after the
    host has dispatched every op of the pass.
    """

    def __init__(self, device: torch.device, pass_s: float):
        super().__init__(device)
        self.asynchronous = True
        self.pass_s = pass_s
        self._free_at = 0.0

    def download(self, probs: torch.Tensor, began: Mark, used: int | None = None) -> Ticket:
        ticket = super().download(probs, began, used)
        with self._lock:
            ticket.ready_at = self._free_at = max(ticket.handed_at, self._free_at) + self.pass_s
        return ticket

    def wait(self, ticket: Ticket) -> tuple[list[float], float]:
        delay = ticket.ready_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)        # releases the GIL, as a host waiting on a GPU is free
            self.count.waited_s += delay
        return _read(ticket), ticket.ready_at - ticket.began.host


def _read(ticket: Ticket) -> list[float]:
    host = ticket.host if ticket.used is None else ticket.host[:ticket.used]
    return host.tolist()


def make_stream(device: torch.device, simulated_pass_ms: float | None = None) -> Stream:
    if simulated_pass_ms:
        if device.type != "cpu":
            raise ValueError("the simulated accelerator runs on the CPU only")
        return SimulatedStream(device, simulated_pass_ms / 1000)
    return Stream(device)

"""How a failed pass ends: for its requests alone, or for the whole worker.

Most failures belong to a request (a bad input, a pass that ran out of
memory) and are retried request by request. A CUDA error other than
out-of-memory (a device-side assert, an illegal address) is different: it
leaves the CUDA context unusable, so every later pass on this process would
fail too while the worker still looked alive. Such an error ends the worker;
its supervisor answers what it held with worker_lost and starts a fresh one.
"""
import math
import traceback

import torch

# Messages of errors after which a CUDA context cannot be used again. Torch
# raises some of them as AcceleratorError, others (cuBLAS, cuDNN) as plain
# RuntimeError, so the message decides.
_STICKY = ("CUDA error", "CUBLAS_STATUS", "CUDNN_STATUS", "cuDNN error", "device-side assert",
           "illegal memory access", "unspecified launch failure", "illegal instruction", "misaligned address")


class DeviceLost(RuntimeError):
    """The device can no longer run passes; the process holding it must end."""


class NonFiniteError(RuntimeError):
    """A pass produced NaN or infinite probabilities: it failed, whatever the kernels said."""


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc)


def is_device_lost(exc: BaseException) -> bool:
    if isinstance(exc, DeviceLost):
        return True
    if is_out_of_memory(exc) or not isinstance(exc, RuntimeError):
        return False
    message = str(exc)
    return isinstance(exc, torch.AcceleratorError) or any(s in message for s in _STICKY)


def release_cached_memory() -> None:
    """After an out-of-memory pass: hand the allocator's cached blocks back, so the retries alone fit.

    A no-op where CUDA was never initialised.
    """
    torch.cuda.empty_cache()


def detached(exc: BaseException) -> BaseException:
    """exc, to be kept past its handler without its frames; where it was raised stays readable, as a note.

    A pass that failed is kept (Launched.error) while its requests are retried
    alone, and its traceback holds every frame the error left: the forward's
    activations, the joined cache. An out-of-memory pass's retries fit only
    once that memory is gone. Clearing those frames is not enough: each still
    links to its caller (f_back), up to the handler's frame, which holds what
    holds the exception, a cycle only a full collection frees, rare in a
    worker. So the traceback goes, for it and for the exceptions it was raised
    from or while handling, and its lines are kept as text.
    """
    chained, seen = [exc], set()
    while chained:
        e = chained.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.__traceback__ is not None:
            e.add_note("raised at (kept as text):\n" + "".join(traceback.format_tb(e.__traceback__)).rstrip())
            e.__traceback__ = None
        chained += [e.__cause__, e.__context__]
    return exc


def check_finite(probabilities: list[list[float]]) -> None:
    bad = sum(1 for row in probabilities for p in row if not math.isfinite(p))
    if bad:
        raise NonFiniteError(f"scoring produced {bad} non-finite probabilities (NaN or infinity); "
                             "the answer was withheld")

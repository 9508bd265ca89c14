"""A video's frames as its header declared them, or an error at the first that is not.

The media checker bounds a video by its header (frame size against the pixel
cap, frame count against the frame cap) and does not decode it: decoding a
whole legitimate video would take longer than a check may. But a container
can carry frames of another size than its header says (an AVI with one 64x48
frame, then 8000x8000 ones passed the check, and took a worker from 642 MB
to 1.9 GB). So whoever decodes a video takes its frames from here, which
refuses the first frame that is not the declared size before anything is
made of it: what passes is what the caps were checked on.
"""


class FrameSizeError(ValueError):
    """A frame that is not the size its video's header declares: the file's fault."""


def frames_as_declared(container, stream, last: int):
    """(index, frame) for frames 0..last of stream, each of the size its header declared."""
    declared = (stream.width, stream.height)      # read first: the decoder updates the stream as it goes
    for i, frame in enumerate(container.decode(stream)):
        if i > last:
            return
        if (frame.width, frame.height) != declared:
            raise FrameSizeError(f"video frame {i} is {frame.width}x{frame.height}, not the "
                                 f"{declared[0]}x{declared[1]} its header declares")
        yield i, frame

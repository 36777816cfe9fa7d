"""How big a message a node accepts, checked before anything is allocated for it.

The largest legitimate messages of a job: a chunk's value or gradient (at most
``chunk_bytes``), a HANDOVER (the value and the optimizer's state tensors, each a frame
of at most a few times ``chunk_bytes`` where the state is wider than the parameter), a
broadcast (frames of :data:`BROADCAST_FRAME_BYTES`, as many as the model needs), and
headers (at most :data:`~trimtab.protocol.messages.MAX_HEADER_BYTES`, DECLARE and MAP
the largest). :meth:`Limits.for_job` derives the limits from those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from trimtab.errors import ConfigError
from trimtab.protocol.messages import MAX_HEADER_BYTES

#: The size of a broadcast's frames (``Context.broadcast`` cuts tensors into these: large
#: single frames are several times slower through ZeroMQ than a few-MiB frames).
BROADCAST_FRAME_BYTES = 4 << 20
#: How much wider than its chunk an optimizer's state tensor may be (a float64 state of
#: a float16 parameter).
_STATE_WIDENING = 4


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one message may be. A peer that sends more is cut off (its connection
    closed, or its message dropped unparsed); a node that would send more gets a
    :class:`ConfigError` saying which limit.

    Attributes:
        max_frame_bytes: bytes in one frame (ZeroMQ's MAXMSGSIZE is set to it).
        max_frames: frames in one message (trimtab's own use 1 to 3, a broadcast one
            per 4 MiB of the model).
        max_message_bytes: bytes in one message, all frames together (a broadcast of
            the whole model is the largest).
    """

    max_frame_bytes: int = 1 << 30
    max_frames: int = 4096
    max_message_bytes: int = 4 << 30
    _most: int = dataclasses.field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        if min(self.max_frame_bytes, self.max_frames, self.max_message_bytes) <= 0:
            raise ConfigError(f"message limits must be positive: {self}")
        # The most bytes a message of one or two frames may hold, as check_frames asks
        # it of every message received (a min() call each, before).
        object.__setattr__(self, "_most", min(self.max_frame_bytes, self.max_message_bytes))

    @classmethod
    def for_job(cls, chunk_bytes: int) -> Limits:
        """The limits of a job of chunks of at most ``chunk_bytes``. Never blocks."""
        frame = max(BROADCAST_FRAME_BYTES, _STATE_WIDENING * chunk_bytes) + MAX_HEADER_BYTES
        return cls(max_frame_bytes=frame)

    def check_frames(self, frames: list[memoryview]) -> str:
        """Why a received message of ``frames`` is over the limits, or ``""``: as
        :meth:`check_lengths`, a header and a payload (or a header alone) within every
        limit in one test."""
        n = len(frames)
        if n == 2:
            if self.max_frames >= 2 and frames[0].nbytes + frames[1].nbytes <= self._most:
                return ""
        elif n == 1 and frames[0].nbytes <= self._most:
            return ""
        return self.check_lengths([f.nbytes for f in frames])

    def check_lengths(self, lengths: tuple[int, ...] | list[int]) -> str:
        """Why a message of frames of ``lengths`` is over the limits, or ``""``."""
        if not 0 < len(lengths) <= self.max_frames:
            return f"a message of {len(lengths)} frames (at most {self.max_frames})"
        biggest = max(lengths)
        if biggest > self.max_frame_bytes:
            return f"a frame of {biggest} bytes (at most {self.max_frame_bytes})"
        total = sum(lengths)
        if total > self.max_message_bytes:
            return f"a message of {total} bytes (at most {self.max_message_bytes})"
        return ""

    def check_frames_sent(self, frames: Sequence[bytes | memoryview]) -> None:
        """:meth:`check_send` of a message of ``frames``, a header and a payload within
        every limit in one test (as :meth:`check_frames`). Raises as it."""
        if 0 < len(frames) <= 2 <= self.max_frames:
            total = 0
            for f in frames:
                total += len(f) if type(f) is bytes else memoryview(f).nbytes
            if total <= self.max_frame_bytes and total <= self.max_message_bytes:
                return
        self.check_send([memoryview(f).nbytes for f in frames])

    def check_send(self, lengths: list[int]) -> None:
        """Raise :class:`ConfigError` if a message of ``lengths`` is over the limits
        (the receiving node of the same job would refuse it). Never blocks."""
        why = self.check_lengths(lengths)
        if why:
            raise ConfigError(
                f"cannot send {why}: peers of this job refuse it. Use smaller chunks "
                "(--chunk-bytes), or broadcast fewer tensors at once"
            )

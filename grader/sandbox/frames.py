"""The two pipes between the grader and its child: length-prefixed frames made by torch.save.

The child writes its progress on one pipe (`Channel`); the grader reads it (`FrameReader`),
checking the run's nonce and the frames' order so that student code cannot forge a report
it did not also know the nonce of. The grader answers a request (the reference cells a case
holds) on the second pipe (`send_reply`), which the child reads with `read_reply`.
Frames are read with `torch.load(weights_only=True)`, which runs no code.
"""

import io
import os
import struct

import torch

MAX_FRAME = 512 * 2**20


def encode(frame: dict) -> bytes:
    """Return `frame` as one length-prefixed frame."""
    buffer = io.BytesIO()
    torch.save(frame, buffer)
    data = buffer.getvalue()
    return struct.pack(">Q", len(data)) + data


def write_all(fd: int, payload: bytes) -> None:
    """Write every byte of `payload` on `fd`."""
    while payload:
        payload = payload[os.write(fd, payload) :]


class Channel:
    """The child's end of the report pipe: numbered frames that carry the run's nonce."""

    def __init__(self, fd: int, nonce: str) -> None:
        self.fd, self.nonce, self.seq = fd, nonce, 0

    def send(self, kind: str, **fields) -> None:
        write_all(self.fd, encode({"nonce": self.nonce, "seq": self.seq, "kind": kind, **fields}))
        self.seq += 1


class FrameReader:
    """The grader's end of the report pipe: parse frames, checking the nonce and the order."""

    def __init__(self, nonce: str) -> None:
        self.nonce, self.buffer, self.seq, self.broken = nonce, b"", 0, ""

    def feed(self, data: bytes) -> list[dict]:
        """Take the bytes read so far; return the frames they complete."""
        self.buffer += data
        frames = []
        while not self.broken and len(self.buffer) >= 8:
            (size,) = struct.unpack(">Q", self.buffer[:8])
            if size > MAX_FRAME:
                self.broken = "a message from the grading process was too large"
                break
            if len(self.buffer) < 8 + size:
                break
            payload, self.buffer = self.buffer[8 : 8 + size], self.buffer[8 + size :]
            try:
                frame = torch.load(io.BytesIO(payload), weights_only=True)
            except Exception:
                self.broken = "a message from the grading process could not be read"
                break
            if (
                not isinstance(frame, dict)
                or frame.get("nonce") != self.nonce
                or frame.get("seq") != self.seq
            ):
                self.broken = "something wrote into the channel of the grading process"
                break
            self.seq += 1
            frames.append(frame)
        return frames


def send_reply(fd: int, nonce: str, **fields) -> None:
    """Write one frame on the pipe the child reads replies from (the grader's side)."""
    try:
        write_all(fd, encode({"nonce": nonce, **fields}))
    except OSError:  # the child has gone (ended or killed): it reads no more replies
        pass


def read_reply(fd: int, nonce: str) -> dict:
    """Read one frame the grader wrote on the reply pipe (the child's side)."""

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise EOFError("the grader closed the reply pipe")
            data += chunk
        return data

    (size,) = struct.unpack(">Q", exactly(8))
    if size > MAX_FRAME:
        raise ValueError("an oversized reply on the grader's pipe")
    reply = torch.load(io.BytesIO(exactly(size)), weights_only=True)
    if not isinstance(reply, dict) or reply.get("nonce") != nonce:
        raise ValueError("an unexpected reply on the grader's pipe")
    return reply

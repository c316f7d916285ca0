"""The two pipes between the grader and its child: length-prefixed frames of plain data.

The child writes its progress on one pipe (`Channel`); the grader reads it (`FrameReader`),
checking the run's nonce and the frames' order so that student code cannot forge a report
it did not also know the nonce of. The grader answers a request (the reference cells a case
holds) on the second pipe (`send_reply`), which the child reads with `read_reply`. What a
frame or a reply says is a message of grader.base.protocol, read back field by field.

A frame is JSON (dicts with string keys, lists, strings, numbers, booleans, None) followed by
the raw bytes of the dense CPU tensors it holds, each named in the JSON by its dtype and
shape: reading it parses JSON and copies bytes, and runs no code. A frame holding anything
else (a tuple, another kind of tensor) is written with `torch.save` instead and read with
`torch.load(weights_only=True)`, which runs no code either; it is slower by far (a grade's
frames took 0.84 s of the grader's time that way, 0.16 s as JSON).
"""

import io
import json
import math
import numbers
import os
import struct

import torch

from grader.base.protocol import REPLIES, Frame, Reply, from_plain, to_plain
from labtext import _

MAX_FRAME = 512 * 2**20
JSON_FRAME = b"J"  # a frame written by torch.save starts with the zip signature, b"PK"
TENSOR_KEY = "\x00tensor"  # {TENSOR_KEY: i} stands for the frame's i-th tensor
DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    )
}


class _NotPlain(Exception):
    """The frame holds something that JSON and dense tensors do not carry exactly."""


def _plain(value, tensors: list[torch.Tensor]):
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    for number, plain in ((numbers.Integral, int), (numbers.Real, float), (str, str)):
        if isinstance(value, number):  # NumPy's numbers, enums and the like: the plain value
            return plain(value)
    if kind is list:
        return [_plain(v, tensors) for v in value]
    if kind is dict:
        if TENSOR_KEY in value or any(type(k) is not str for k in value):
            raise _NotPlain
        return {k: _plain(v, tensors) for k, v in value.items()}
    if (
        kind is torch.Tensor
        and value.layout == torch.strided
        and value.device.type == "cpu"
        and not value.requires_grad
        and str(value.dtype).removeprefix("torch.") in DTYPES
    ):
        tensors.append(value)
        return {TENSOR_KEY: len(tensors) - 1}
    raise _NotPlain


def encode(frame: dict) -> bytes:
    """Return `frame` as one length-prefixed frame."""
    tensors: list[torch.Tensor] = []
    try:
        body = _plain(frame, tensors)
    except (_NotPlain, RecursionError):
        buffer = io.BytesIO()
        torch.save(frame, buffer)
        data = buffer.getvalue()
        return struct.pack(">Q", len(data)) + data
    raw = [t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for t in tensors]
    specs = [
        [str(t.dtype).removeprefix("torch."), list(t.shape), len(r)]
        for t, r in zip(tensors, raw, strict=True)
    ]
    text = json.dumps({"frame": body, "tensors": specs}).encode()
    data = JSON_FRAME + struct.pack(">Q", len(text)) + text + b"".join(raw)
    return struct.pack(">Q", len(data)) + data


def decode(payload: bytes):
    """Return the frame in `payload`; raise ValueError (or another error) if it is not one."""
    if not payload.startswith(JSON_FRAME):
        return torch.load(io.BytesIO(payload), weights_only=True)
    (size,) = struct.unpack(">Q", payload[1:9])
    parsed = json.loads(payload[9 : 9 + size])
    raw = memoryview(payload)[9 + size :]
    tensors, offset = [], 0
    for spec in parsed["tensors"]:
        name, shape, nbytes = spec
        dtype = DTYPES[name]
        if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
            raise ValueError("a tensor's shape is not a list of sizes")
        itemsize = dtype.itemsize
        if type(nbytes) is not int or nbytes != math.prod(shape) * itemsize:
            raise ValueError("a tensor's size does not match its shape")
        if offset + nbytes > len(raw):
            raise ValueError("a tensor's bytes run past the frame")
        data = bytearray(raw[offset : offset + nbytes])
        offset += nbytes
        flat = torch.frombuffer(data, dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
        tensors.append(flat.reshape(shape))
    if offset != len(raw):
        raise ValueError("a frame has bytes that no tensor owns")
    return _with_tensors(parsed["frame"], tensors)


def _with_tensors(value, tensors: list[torch.Tensor]):
    if isinstance(value, list):
        return [_with_tensors(v, tensors) for v in value]
    if isinstance(value, dict):
        if TENSOR_KEY in value:
            (index,) = value.values()  # exactly one key: anything else is not a frame
            if type(index) is not int or not 0 <= index < len(tensors):
                raise ValueError("a frame names a tensor it does not hold")
            return tensors[index]
        return {k: _with_tensors(v, tensors) for k, v in value.items()}
    return value


def write_all(fd: int, payload: bytes) -> None:
    """Write every byte of `payload` on `fd`."""
    while payload:
        payload = payload[os.write(fd, payload) :]


class Channel:
    """The child's end of the report pipe: numbered frames that carry the run's nonce."""

    def __init__(self, fd: int, nonce: str) -> None:
        self.fd, self.nonce, self.seq = fd, nonce, 0

    def send(self, frame: Frame) -> None:
        write_all(self.fd, encode({"nonce": self.nonce, "seq": self.seq, **to_plain(frame)}))
        self.seq += 1


class FrameReader:
    """The grader's end of the report pipe: parse frames, checking the nonce and the order."""

    def __init__(self, nonce: str) -> None:
        self.nonce, self.buffer, self.seq, self.broken = nonce, bytearray(), 0, ""

    def feed(self, data: bytes) -> list[Frame]:
        """Take the bytes read so far; return the frames they complete."""
        self.buffer += data
        frames = []
        while not self.broken and len(self.buffer) >= 8:
            (size,) = struct.unpack(">Q", self.buffer[:8])
            if size > MAX_FRAME:
                self.broken = _("a message from the grading process was too large")
                break
            if len(self.buffer) < 8 + size:
                break
            payload = bytes(self.buffer[8 : 8 + size])
            del self.buffer[: 8 + size]
            try:
                frame = decode(payload)
            except Exception:
                self.broken = _("a message from the grading process could not be read")
                break
            if (
                not isinstance(frame, dict)
                or frame.pop("nonce", None) != self.nonce
                or frame.pop("seq", None) != self.seq
            ):
                self.broken = _("something wrote into the channel of the grading process")
                break
            try:
                frames.append(from_plain(frame))
            except ValueError:
                self.broken = _("a message from the grading process could not be read")
                break
            self.seq += 1
        return frames


def send_reply(fd: int, nonce: str, reply: Reply) -> None:
    """Write one frame on the pipe the child reads replies from (the grader's side)."""
    try:
        write_all(fd, encode({"nonce": nonce, **to_plain(reply)}))
    except OSError:  # the child has gone (ended or killed): it reads no more replies
        pass


def read_reply(fd: int, nonce: str) -> Reply:
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
    reply = decode(exactly(size))
    if not isinstance(reply, dict) or reply.pop("nonce", None) != nonce:
        raise ValueError("an unexpected reply on the grader's pipe")
    return from_plain(reply, REPLIES)

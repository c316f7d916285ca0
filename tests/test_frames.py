"""The frames between the grading child and the grader carry what a case saw exactly, and a
frame that lies about its tensors is refused, not believed."""

import json
import math
import struct

import pytest
import torch

from grader.base.outcomes import Raised
from grader.base.protocol import (
    REPLIES,
    CaseDone,
    CaseOutcome,
    CellRef,
    ExerciseDone,
    Go,
    HeldCells,
    Note,
    NotebookLoaded,
    from_plain,
    to_plain,
)
from grader.sandbox.frames import DTYPES, JSON_FRAME, TENSOR_KEY, FrameReader, decode, encode


def round_trip(frame: dict) -> tuple[dict, bytes]:
    data = encode(frame)
    (size,) = struct.unpack(">Q", data[:8])
    assert size == len(data) - 8
    return decode(data[8:]), data[8:]


def test_tensors_of_every_kind_come_back_equal_in_value_dtype_and_shape():
    tensors = [torch.arange(12).reshape(3, 4).to(dtype) for dtype in DTYPES.values()]
    tensors += [
        torch.tensor(2.5),  # no dimensions
        torch.zeros(0, 5),  # no elements
        torch.arange(6.0).reshape(2, 3).t(),  # not contiguous
        torch.tensor([float("nan"), float("inf"), -0.0]),
    ]
    back, payload = round_trip({"kind": "case", "value": tensors})
    assert payload.startswith(JSON_FRAME)
    for sent, got in zip(tensors, back["value"], strict=True):
        assert type(got) is torch.Tensor
        assert got.dtype == sent.dtype and got.shape == sent.shape
        assert torch.equal(got.nan_to_num(), sent.nan_to_num())
    assert math.copysign(1.0, float(back["value"][-1][2])) == -1.0


def test_plain_values_come_back_as_they_were_sent():
    frame = {
        "text": "测试精度 é \udcff",
        "big": 2**70,
        "nan": float("nan"),
        "flags": [True, False, None],
        "nested": {"a": [{"b": [1, 2.5]}]},
    }
    back, _ = round_trip(frame)
    assert math.isnan(back.pop("nan"))
    frame.pop("nan")
    assert back == frame


@pytest.mark.filterwarnings("ignore:Validating sparse tensor invariants")
@pytest.mark.parametrize(
    "value",
    [
        (1, 2),  # a tuple, which JSON would make a list
        {TENSOR_KEY: 0, "other": 1},  # a student's dict that uses the frames' own key
        torch.eye(3).to_sparse(),  # a tensor that is not dense
    ],
)
def test_what_json_cannot_carry_exactly_still_comes_back_exactly(value):
    back, payload = round_trip({"kind": "case", "value": value})
    assert not payload.startswith(JSON_FRAME)
    got = back["value"]
    if isinstance(value, torch.Tensor):
        assert torch.equal(got.to_dense(), value.to_dense())
    else:
        assert got == value and type(got) is type(value)


def forged(frame: dict, tensors: list, raw: bytes) -> bytes:
    text = json.dumps({"frame": frame, "tensors": tensors}).encode()
    payload = JSON_FRAME + struct.pack(">Q", len(text)) + text + raw
    return struct.pack(">Q", len(payload)) + payload


@pytest.mark.parametrize(
    "tensors, raw, names",
    [
        ([["float32", [4], 16]], b"\0" * 8, 0),  # bytes that run past the frame
        ([["float32", [4], 12]], b"\0" * 12, 0),  # a size that does not match the shape
        ([["object", [1], 8]], b"\0" * 8, 0),  # a dtype that is not a tensor's
        ([["float32", [-1], 4]], b"\0" * 4, 0),  # a negative size
        ([["float32", [1], 4]], b"\0" * 4, 3),  # a tensor the frame does not hold
        ([["float32", [1], 4]], b"\0" * 12, 0),  # bytes that no tensor owns
    ],
)
def test_a_frame_that_lies_about_its_tensors_breaks_the_channel(tensors, raw, names):
    reader = FrameReader("n")
    frame = {"nonce": "n", "seq": 0, "kind": "case", "value": {TENSOR_KEY: names}}
    assert reader.feed(forged(frame, tensors, raw)) == []
    assert reader.broken == "a message from the grading process could not be read"


def case_done(i: int) -> CaseDone:
    return CaseDone("allreduce", f"case{i}", CaseOutcome(f"case{i}", value=torch.full((1000,), i)))


def test_frames_split_across_reads_come_out_whole_in_order_and_typed():
    reader = FrameReader("n")
    data = b"".join(encode({"nonce": "n", "seq": i, **to_plain(case_done(i))}) for i in range(3))
    frames = []
    for start in range(0, len(data), 777):
        frames += reader.feed(data[start : start + 777])
    assert not reader.broken
    assert [type(f) for f in frames] == [CaseDone] * 3
    assert [f.case for f in frames] == ["case0", "case1", "case2"]
    assert all(torch.equal(f.outcome.value, torch.full((1000,), i)) for i, f in enumerate(frames))


@pytest.mark.parametrize(
    "frame",
    [
        {"kind": "launch", "exercise": "allreduce"},  # a kind the protocol has not
        {"kind": "case", "exercise": "allreduce", "case": "c"},  # no outcome
        {"kind": "case", "exercise": "allreduce", "case": "c", "outcome": {"seconds": "1"}},
        {"kind": "exercise-done", "exercise": "allreduce", "changed": "x"},  # not a list
        {"kind": "statement", "notebook": "a.ipynb", "cell": 1, "line": 2.5},  # not an int
        {"kind": "claim", "exercise": "allreduce", "case": "c", "go": True},  # a field too many
    ],
)
def test_a_frame_that_is_not_a_message_of_the_protocol_breaks_the_channel(frame):
    """Every field is read as its type: a frame with a field missing, of another type or
    unknown is refused as a whole, as one that lies about its tensors is."""
    reader = FrameReader("n")
    assert reader.feed(encode({"nonce": "n", "seq": 0, **frame})) == []
    assert reader.broken == "a message from the grading process could not be read"


def test_messages_come_back_as_the_dataclasses_they_were():
    error = Raised("ValueError", "no", "", "")
    outcome = CaseOutcome("c", held=False, error=error, seconds=1, limit="x")
    note = Note("raised", "cell `x`, line 1: raised", CellRef("first line", "x", 2), "a.ipynb")
    for message in (
        NotebookLoaded("a.ipynb", [note], seconds=0.5),
        ExerciseDone("allreduce", ["d2l"], "a.ipynb could not be loaded"),
        CaseDone("allreduce", "c", outcome),
    ):
        assert from_plain(to_plain(message)) == message
    assert from_plain(to_plain(HeldCells(None)), REPLIES) == HeldCells(None)
    assert from_plain(to_plain(Go(True)), REPLIES) == Go(True)
    with pytest.raises(ValueError):
        from_plain(to_plain(Go(True)))  # a reply is not a frame


def test_what_only_the_grader_says_of_a_case_is_not_taken_from_a_child():
    """A case's outcome as a child's frame says it: why the grader stopped it, the limit that
    did and the reference's time are the grader's to say, and a frame's are dropped."""
    from grader.sandbox.collected import Collected
    from grader.sandbox.watching import Watch, follow

    said = CaseOutcome("c", value=1, stopped="stopped by the grader", limit="processor time")
    collected = Collected()
    follow(CaseDone("allreduce", "c", said), Watch(), 0.0, collected, {}, -1, "n")
    kept = collected.outcomes["allreduce"]["c"]
    assert kept.value == 1 and kept.stopped is None and kept.limit == ""

"""Carry what a case saw from the grading child to the grader, as plain data.

`pack` turns tensors, devices and containers into dicts, lists and CPU tensors that
`torch.save` writes and `torch.load(weights_only=True)` reads back without running any code.
`unpack` turns them into `SeenTensor` records for the checks. Anything else is sent as its
type name and a short repr, never as a live object.
"""

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dplab.sim import backing
from grader.base.outcomes import Attempt, Raised

_TENSOR, _DEVICE, _TUPLE, _OTHER = "__tensor__", "__device__", "__tuple__", "__other__"
_ATTEMPT, _RAISED = "__attempt__", "__raised__"
MAX_DEPTH = 12


@dataclass(frozen=True)
class SeenTensor:
    """A tensor as the student's code left it: a CPU copy of its values and its attributes."""

    value: Tensor
    device: str
    requires_grad: bool
    is_leaf: bool
    grad: "SeenTensor | None"
    ptr: int
    ident: int

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.value.dtype


@dataclass(frozen=True)
class Other:
    """A value that is not plain data (a module, a custom object): only its type and repr."""

    type_name: str
    text: str


def _pack_tensor(t: Tensor, with_grad: bool = True) -> dict:
    plain = backing(t.detach())  # a stand-in tensor's data lives in its backing tensor
    if type(plain) is not Tensor:
        plain = plain.as_subclass(Tensor)
    grad = None
    if with_grad:
        with warnings.catch_warnings():  # reading .grad of a non-leaf warns; it is only read
            warnings.simplefilter("ignore")
            grad = t.grad
    return {
        _TENSOR: plain.to("cpu").clone(),
        "device": str(t.device),
        "requires_grad": bool(t.requires_grad),
        "is_leaf": bool(t.is_leaf),
        "grad": _pack_tensor(grad, with_grad=False) if grad is not None else None,
        "ptr": int(plain.data_ptr()),
        "ident": id(t),
    }


def pack(value: Any, depth: int = 0) -> Any:
    """Return `value` as plain data: see the module docstring."""
    if depth > MAX_DEPTH:
        return {_OTHER: ["nested too deep", "..."]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Tensor):
        return _pack_tensor(value)
    if isinstance(value, torch.device):
        return {_DEVICE: str(value)}
    if isinstance(value, list):
        return [pack(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {_TUPLE: [pack(v, depth + 1) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: pack(v, depth + 1) for k, v in value.items()}
    if type(value) is Raised:
        return {_RAISED: value.as_data()}
    if type(value) is Attempt:
        raised = value.raised.as_data() if value.raised is not None else None
        at = value.at if isinstance(value.at, float) else None
        return {_ATTEMPT: [pack(value.returned, depth + 1), raised, at]}
    try:
        text = repr(value)[:200]
    except Exception:
        text = "<repr failed>"
    return {_OTHER: [type(value).__name__, text]}


def unpack(value: Any) -> Any:
    """Turn plain data from `pack` back into values, with `SeenTensor` for tensors."""
    if isinstance(value, list):
        return [unpack(v) for v in value]
    if not isinstance(value, dict):
        return value if value is None or isinstance(value, bool | int | float | str) else None
    if _TENSOR in value:
        data = value[_TENSOR]
        if type(data) is not Tensor:
            return Other("invalid", "a tensor record without a tensor")
        grad = value.get("grad")
        return SeenTensor(
            value=data,
            device=str(value.get("device")),
            requires_grad=bool(value.get("requires_grad")),
            is_leaf=bool(value.get("is_leaf")),
            grad=unpack(grad) if isinstance(grad, dict) else None,
            ptr=int(value.get("ptr", 0)),
            ident=int(value.get("ident", 0)),
        )
    if _DEVICE in value:
        return torch.device(str(value[_DEVICE]))
    if _TUPLE in value:
        return tuple(unpack(v) for v in value[_TUPLE])
    if _OTHER in value:
        type_name, text = (list(value[_OTHER]) + ["?", "?"])[:2]
        return Other(str(type_name), str(text))
    if _RAISED in value:
        return Raised.from_data(value[_RAISED]) if isinstance(value[_RAISED], dict) else None
    if _ATTEMPT in value:
        returned, raised, at = (list(value[_ATTEMPT]) + [None, None, None])[:3]
        crash = Raised.from_data(raised) if isinstance(raised, dict) else None
        return Attempt(unpack(returned), crash, at if isinstance(at, float) else None)
    return {str(k): unpack(v) for k, v in value.items()}

"""Comparisons that explain themselves: what came back, and what was expected."""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from grader.base.outcomes import Fail
from grader.base.values import SeenTensor
from labtext import _


def _brief(values: Any) -> str:
    """Write numbers (nested in lists, as Tensor.tolist gives them) to four significant digits."""
    if isinstance(values, list):
        return f"[{', '.join(_brief(v) for v in values)}]"
    if not isinstance(values, float):
        return repr(values)
    text = f"{values:.4g}"
    return text if any(c in text for c in ".en") else f"{text}.0"  # 3.0, not 3


def short(value: Any, limit: int = 8) -> str:
    """Describe a tensor (or anything) briefly: up to `limit` numbers in full (to four
    significant digits), a longer tensor by its shape and first values."""
    if isinstance(value, SeenTensor):
        value = value.value
    if isinstance(value, Tensor):
        if value.numel() <= limit:
            body = _brief(value.tolist())
        else:
            head = ", ".join(_brief(v) for v in value.flatten()[:4].tolist())
            body = _("shape {shape} starting [{head}, ...]").format(
                shape=tuple(value.shape), head=head
            )
        return f"{body} ({str(value.dtype).removeprefix('torch.')})"
    if isinstance(value, list | tuple):  # each item briefly: a tensor's repr runs to pages
        items = [short(item, limit) for item in value[:4]]
        if len(value) > 4:
            items.append(_("... {count} items in all").format(count=len(value)))
        if isinstance(value, list):
            return f"[{', '.join(items)}]"
        return f"({', '.join(items)}{',' if len(value) == 1 else ''})"
    if isinstance(value, float):
        return _brief(value)
    return repr(value)


def tensor_in(value: Any, what: str) -> Tensor:
    """Return the tensor inside `value`, or fail saying that `what` was not a tensor."""
    if isinstance(value, SeenTensor):
        return value.value
    if isinstance(value, Tensor):  # computed by the grader itself
        return value
    raise Fail(_("{what}: expected a tensor, got {got}").format(what=what, got=short(value)))


def expect(condition: bool, message: str, hint: str | None = None, see: str | None = None) -> None:
    """Fail with `message` unless `condition` holds (`see`: the check that owns the cause,
    as `Fail` says)."""
    if not condition:
        raise Fail(message, hint, see)


def _same_shape(actual: Tensor, expected: Tensor, what: str) -> None:
    if actual.shape != expected.shape:
        raise Fail(
            _("{what}: came back with shape {shape}, expected {expected}").format(
                what=what, shape=tuple(actual.shape), expected=tuple(expected.shape)
            )
        )


@contextlib.contextmanager
def _owned_by(see: str | None) -> Iterator[None]:
    """Say of a Fail raised in the block that its cause is the one check `see` judges."""
    try:
        yield
    except Fail as fail:
        fail.see = fail.see or see
        raise


def expect_equal(
    value: Any, expected: Tensor, what: str, hint: str | None = None, see: str | None = None
) -> None:
    """Fail unless `value` is a tensor exactly equal to `expected` (same shape and dtype);
    `see` as `expect` says."""
    with _owned_by(see):
        _expect_equal(value, expected, what, hint)


def _expect_equal(value: Any, expected: Tensor, what: str, hint: str | None) -> None:
    actual = tensor_in(value, what)
    _same_shape(actual, expected, what)
    if actual.dtype != expected.dtype:
        raise Fail(_came_back_as(what, actual.dtype, expected.dtype), hint)
    if not torch.equal(actual, expected):
        raise Fail(_came_back(what, short(actual), short(expected)), hint)


def expect_close(
    value: Any,
    expected: Tensor,
    what: str,
    hint: str | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    see: str | None = None,
) -> None:
    """Fail unless `value` is a tensor close to `expected`, naming the largest difference;
    `see` as `expect` says."""
    with _owned_by(see):
        _expect_close(value, expected, what, hint, rtol, atol)


def _expect_close(
    value: Any, expected: Tensor, what: str, hint: str | None, rtol: float, atol: float
) -> None:
    actual = tensor_in(value, what)
    _same_shape(actual, expected, what)
    actual = actual.to(torch.float64)
    target = expected.to(torch.float64)
    if torch.isnan(actual).any() and not torch.isnan(target).any():
        raise Fail(
            _("{what}: came back with NaN values, expected {expected}").format(
                what=what, expected=short(expected)
            ),
            hint,
        )
    if not torch.allclose(actual, target, rtol=rtol, atol=atol):
        gap = (actual - target).abs()
        worst = divmod_index(int(gap.argmax()), tuple(actual.shape))
        raise Fail(
            _(
                "{what}: came back {got}, expected {expected}; "
                "the largest difference is {gap} at index {index}"
            ).format(
                what=what,
                got=short(actual.to(expected.dtype)),
                expected=short(expected),
                gap=f"{float(gap.max()):.3g}",
                index=worst,
            ),
            hint,
        )


def expect_kept_dtype(value: Tensor, expected: Tensor, what: str, hint: str) -> None:
    """Fail with `hint` where `value` has another dtype than `expected`, or holds integers
    off `expected` by no more than float32's rounding (a sum computed in floats and turned
    back): evidence of the one mistake `hint` names."""
    if value.dtype != expected.dtype:
        raise Fail(_came_back_as(what, value.dtype, expected.dtype), hint)
    if expected.is_floating_point() or torch.equal(value, expected):
        return
    if torch.allclose(value.to(torch.float64), expected.to(torch.float64), rtol=1e-6, atol=1.0):
        raise Fail(
            _("{what}: came back {got}, expected {expected}: off by float32's rounding").format(
                what=what, got=short(value), expected=short(expected)
            ),
            hint,
        )


def _came_back(what: str, got: str, expected: str) -> str:
    return _("{what}: came back {got}, expected {expected}").format(
        what=what, got=got, expected=expected
    )


def _came_back_as(what: str, dtype: torch.dtype, expected: torch.dtype) -> str:
    return _("{what}: came back as {dtype}, expected {expected}").format(
        what=what, dtype=dtype, expected=expected
    )


def divmod_index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Turn a flat index into a multi-dimensional one."""
    index = []
    for size in reversed(shape):
        flat, rest = divmod(flat, size)
        index.append(rest)
    return tuple(reversed(index))


def close(a: Tensor, b: Tensor, rtol: float = 1e-4, atol: float = 1e-6) -> bool:
    """Return True when two tensors have the same shape and close values."""
    return a.shape == b.shape and torch.allclose(
        a.to(torch.float64), b.to(torch.float64), rtol=rtol, atol=atol
    )

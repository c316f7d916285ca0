"""Public checks of `allreduce(data)`: every tensor in `data` ends holding the sum, in place."""

import torch

from grader.api import (
    N_,
    Crash,
    Fail,
    SeenTensor,
    _,
    all_finished,
    attempt,
    case,
    check_on,
    close,
    cycle,
    error_hints,
    expect,
    expect_close,
    expect_equal,
    expect_kept_dtype,
    finished,
    observe,
    raised_in,
    short,
    tensor_in,
)

REBIND_HINT = N_(
    "`data[i] = ...` only makes the list point at a new tensor; the tensor the caller holds "
    "(a gradient, say) keeps its old values. Write into it instead: data[i][:] = ... "
    "or data[i].copy_(...)."
)
COPY_BACK_HINT = N_(
    "After adding every tensor into data[0], copy the total back into each of the others, "
    "moved to its device: data[i][:] = data[0].to(data[i].device)."
)
DTYPE_HINT = N_(
    "Keep each tensor's dtype: add with += (or torch.add) into the tensors themselves; "
    "do not go through Python floats or float32."
)


def run_on(student, tensors: list[torch.Tensor], devices: list[torch.device]) -> dict:
    """Put the tensors on the devices, call allreduce, and note the tensors given and the list
    (and the error, if the call raised: the other lists are still tried)."""
    data = [t.to(d) for t, d in zip(tensors, devices, strict=True)]
    given = list(data)
    call = attempt(student.fn, data)
    return {"given": given, "listed": data, "raised": call.raised}


def float_lists(seed: int) -> list[list[torch.Tensor]]:
    """Return, for k = 1 to 8, a list of k random float32 tensors of shape (3, 4)."""
    gen = torch.Generator().manual_seed(seed)
    return [[torch.randn(3, 4, generator=gen) for _ in range(k)] for k in range(1, 9)]


def mixed_lists(seed: int) -> list[list[torch.Tensor]]:
    """Return lists of three tensors of other dtypes and shapes, integers as large as 2**40."""
    gen = torch.Generator().manual_seed(seed)
    return [
        [torch.randn(2, 3, 4, generator=gen, dtype=torch.float64) for _ in range(3)],
        [torch.randint(-(2**40), 2**40, (5,), generator=gen) for _ in range(3)],
        [torch.randint(-1000, 1000, (1, 2), generator=gen, dtype=torch.int32) for _ in range(3)],
        [torch.randn(7, generator=gen) for _ in range(3)],
    ]


def rebound(seen: dict) -> bool:
    """Return True if the list now holds other tensor objects than the ones it was given."""
    return any(a.ident != b.ident for a, b in zip(seen["given"], seen["listed"], strict=False))


def expect_sums(
    tensors: list, parts: list[torch.Tensor], what: str, see: str | None = None
) -> None:
    """Fail unless each of `tensors` holds the sum of `parts`, exactly for integers; the hint
    names a mistake only where the values show it: a tensor the total never reached, or the
    sum of some tensors only (`see`: the check that owns these causes), a dtype changed,
    integers summed through floats (`expect_kept_dtype`)."""
    total = torch.stack(parts).sum(dim=0, dtype=parts[0].dtype)
    for i, t in enumerate(tensors):
        label = _("{what}: tensor {i} of {count}").format(what=what, i=i, count=len(tensors))
        value = tensor_in(t, label)
        right = value.dtype == total.dtype and (
            close(value, total, 1e-5, 1e-5)
            if total.is_floating_point()
            else torch.equal(value, total)
        )
        if value.shape == total.shape and not right:
            summed = any(  # somewhere the sum was made: it was not copied back
                isinstance(o := unwrapped(x), torch.Tensor) and close(o, total, 1e-5, 1e-5)
                for x in tensors
            )
            if summed and value.dtype == parts[i].dtype and torch.equal(value, parts[i]):
                raise Fail(
                    _(
                        "{label}: still holds its own values {values}; the total never reached it"
                    ).format(label=label, values=short(value)),
                    COPY_BACK_HINT,
                    see,
                )
            expect_kept_dtype(value, total, label, DTYPE_HINT)
            some = summed_from(value, parts)
            if len(some) > 1:
                which = ", ".join(str(j) for j in some)
                raise Fail(
                    _("{label}: holds the sum of tensors {which} only, of {count}").format(
                        label=label, which=which, count=len(parts)
                    ),
                    _("Loop over all of data: the sum must include every tensor."),
                    see,
                )
        if total.is_floating_point():  # no known cause: the check's own hint, and its charge
            expect_close(value, total, label, rtol=1e-5, atol=1e-5)
        else:
            expect_equal(value, total, label)


def did_the_work(outcome: dict, parts: list[torch.Tensor]) -> bool:
    """Return True when some tensor of a call's list ends holding the sum of two or more of
    `parts` (all of them, or some): the call moved values across devices, so where its
    results stay and whether they share memory can be seen. Values left alone, or written
    with anything else (NaN, a constant), show neither."""
    if len(parts) < 2 or raised_in(outcome) is not None:
        return False
    total = torch.stack(parts).sum(dim=0, dtype=parts[0].dtype)
    for t in [*outcome["listed"], *outcome["given"]]:
        value = unwrapped(t)
        if isinstance(value, torch.Tensor) and value.shape == total.shape:
            if (
                close(value.double(), total.double(), 1e-5, 1e-5)
                or len(summed_from(value, parts)) > 1
            ):
                return True
    return False


def worked(seen: list, lists: list[list[torch.Tensor]]) -> list[int]:
    """Return the indices of the calls that did the work (`did_the_work`); where none did,
    there are no results to look at (every_tensor_holds_the_sum judges that)."""
    done = [i for i, (o, ts) in enumerate(zip(seen, lists, strict=True)) if did_the_work(o, ts)]
    longer = [i for i, ts in enumerate(lists) if len(ts) > 1]
    crashes = [raised_in(seen[i]) for i in longer]
    if all(crashes):  # every call with something to sum raised: that error is all there is
        raise Crash(crashes[0], every_call=True, calls=len(longer))
    observe(
        done,
        "every_tensor_holds_the_sum",
        N_("no tensor ended holding a sum of the tensors given: there is no result to look at"),
    )
    return done


def unwrapped(value):
    """Return the tensor a recorded value holds, or the value itself."""
    return value.value if isinstance(value, SeenTensor) else value


def summed_from(value: torch.Tensor, parts: list[torch.Tensor]) -> list[int]:
    """Return the indices of the parts whose sum `value` is, where it is the sum of some of
    them but not all (the lists have at most eight); else []."""
    k = len(parts)
    for mask in range(1, 2**k - 1):
        chosen = [j for j in range(k) if mask >> j & 1]
        some = torch.stack([parts[j] for j in chosen]).sum(dim=0, dtype=parts[0].dtype)
        if close(value, some, 1e-5, 1e-5):
            return chosen
    return []


@case
def book_demo(student, ctx):
    """The book's demo: [[1, 1]] on one device and [[2, 2]] on another."""
    return run_on(student, [torch.ones((1, 2)) * (i + 1) for i in range(2)], ctx.devices[:2])


@case
def one_to_eight_tensors(student, ctx):
    """Lists of 1 to 8 random float32 tensors, spread round-robin over the devices."""
    return [run_on(student, ts, cycle(ctx.devices, len(ts))) for ts in float_lists(ctx.seed)]


@case
def given_lists(student, ctx, lists: list[list[torch.Tensor]]):
    """The lists of tensors the grader sends, each spread round-robin over the devices."""
    return [run_on(student, ts, cycle(ctx.devices, len(ts))) for ts in lists]


@case
def other_dtypes_and_shapes(student, ctx):
    """float64, int64 and int32 tensors of several shapes, three to a list."""
    return [run_on(student, ts, cycle(ctx.devices, len(ts))) for ts in mixed_lists(ctx.seed)]


@check_on(
    book_demo,
    points=2,
    hint="Add every other tensor into data[0] (moved to data[0]'s device), then copy the "
    "total back into each of the others.",
)
def book_demo_gives_threes_on_both_devices(seen, ctx):
    """[[1., 1.]] and [[2., 2.]] both become [[3., 3.]].
    Property: the book's demo; against the reference (its known output)."""
    # A wrong sum here is the cause every_tensor_holds_the_sum judges on more lists.
    all_finished([seen])
    parts = [torch.ones((1, 2)) * (i + 1) for i in range(2)]
    slip = "every_tensor_holds_the_sum" if did_the_work(seen, parts) else None
    for i, t in enumerate(seen["listed"]):
        expect_equal(
            t, torch.tensor([[3.0, 3.0]]), _("data[{i}] after allreduce").format(i=i), see=slip
        )


@check_on(
    one_to_eight_tensors,
    points=2,
    hint="Loop over all of data: the sum must include every tensor, and every tensor "
    "must receive it (a list of one is left as it is).",
)
def every_tensor_holds_the_sum(seen, ctx):
    """For 1 to 8 tensors, each one given ends holding the sum of all of them.
    Property: the sum; against the reference (torch's sum of the same tensors)."""
    for ts, outcome in zip(float_lists(ctx.seed), seen, strict=True):
        if raised_in(outcome) is None:  # what came back shows more than the error does
            expect_sums(outcome["listed"], ts, _("with {count} tensors").format(count=len(ts)))
    all_finished(seen)


@check_on(
    other_dtypes_and_shapes,
    points=1,
    hint="Each tensor must end holding the sum in its own dtype, exactly for integers.",
)
def keeps_dtypes_and_sums_integers_exactly(seen, ctx):
    """float64, int64 (up to 2**40) and int32 tensors keep their dtype; integers sum exactly.
    Property: dtypes and exact integer sums; against the reference (torch's sum in the same
    dtype)."""
    all_finished(seen)
    for ts, outcome in zip(mixed_lists(ctx.seed), seen, strict=True):
        what = _("{dtype} tensors of shape {shape}").format(
            dtype=ts[0].dtype, shape=tuple(ts[0].shape)
        )
        expect_sums(outcome["listed"], ts, what, see="every_tensor_holds_the_sum")


@check_on(
    one_to_eight_tensors,
    points=2,
    hint="The tensors passed in (the caller's gradients, say) must hold the sum themselves: "
    "write into them, with data[i][:] = ... or data[i].copy_(...).",
)
def writes_into_the_tensors_it_was_given(seen, ctx):
    """The tensor objects passed in (the caller's gradients, say) hold the sum afterwards.
    Property: the sum is written in place; a relation: the tensor objects after the call against
    those given."""
    lists = float_lists(ctx.seed)
    # A list of one tensor shows nothing of this: where every longer list raised, nothing
    # was judged, and the check fails with the error.
    done = [i for i in finished(seen) if len(lists[i]) > 1]
    if not done:
        raise Crash(next(r for o in seen[1:] if (r := raised_in(o)) is not None), every_call=True)
    for i, (ts, outcome) in enumerate(zip(lists, seen, strict=True)):
        if i not in done:
            continue
        k = len(ts)
        if rebound(outcome):
            raise Fail(
                _(
                    "with {count} tensors, allreduce put new tensors into the list; the tensors "
                    "it was given were not all updated"
                ).format(count=k),
                REBIND_HINT,
            )
        what = _("with {count} tensors, the tensors given").format(count=k)
        expect_sums(outcome["given"], ts, what, see="every_tensor_holds_the_sum")


@check_on(
    one_to_eight_tensors,
    points=1,
    hint="Move the total to each tensor's own device before writing it there.",
)
def each_result_stays_on_its_device(seen, ctx):
    """Each tensor is still on the device it started on.
    Property: where the results are; against the reference (the device each tensor started on)."""
    for i in worked(seen, float_lists(ctx.seed)):
        outcome = seen[i]
        wanted = [str(d) for d in cycle(ctx.devices, len(outcome["given"]))]
        got = [t.device for t in outcome["listed"] if isinstance(t, SeenTensor)]
        expect(
            got == wanted,
            _("the tensors are on {got}, expected {wanted}").format(got=got, wanted=wanted),
        )


@check_on(
    one_to_eight_tensors,
    points=1,
    hint="Give each tensor its own copy of the total: copy values into it (data[i][:] = ...) "
    "rather than making it share the total's memory (data[i].data = ..., .set_(...)).",
)
def no_two_results_share_memory(seen, ctx):
    """After allreduce, no two of the tensors it was given share memory, so changing one
    (a gradient, say) leaves the others alone.
    Property: the results are independent; a relation: the tensors given against one another."""
    # Entries put into the list in their place are writes_into_the_tensors_it_was_given's.
    for i in worked(seen, float_lists(ctx.seed)):
        given = [t for t in seen[i]["given"] if isinstance(t, SeenTensor)]
        keys = [(t.device, t.ptr) for t in given]
        for b, key in enumerate(keys):
            if key in keys[:b]:
                a = keys.index(key)
                raise Fail(
                    _(
                        "with {count} tensors, the tensors given as data[{i}] and data[{j}] "
                        "are now the same memory: changing one changes the other"
                    ).format(count=len(given), i=a, j=b)
                )


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if "Expected all tensors to be on the same device" in raised.message:
        return _("Move each tensor to data[0]'s device with .to(data[0].device) before adding it.")
    return None

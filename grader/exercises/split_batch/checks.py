"""Public checks of `split_batch(X, y, devices)`: one shard of the minibatch per device."""

import torch

from grader.api import (
    N_,
    Fail,
    SeenTensor,
    Unobserved,
    _,
    all_finished,
    attempt,
    case,
    check_on,
    cycle,
    error_hints,
    expect,
    expect_equal,
    finished,
    observe,
    raised_in,
    short,
)

UNEVEN = [(5, 2), (7, 3), (8, 4)]  # (rows, devices)


def shards_of(seen, what: str) -> list[SeenTensor]:
    """Return a list of shards, or fail saying what came back instead."""
    if not (isinstance(seen, list | tuple) and all(isinstance(t, SeenTensor) for t in seen)):
        raise Fail(
            _("the {what} shards came back as {got}, expected a sequence of tensors").format(
                what=what, got=short(seen)
            )
        )
    return list(seen)


def pair_of(seen) -> tuple[list[SeenTensor], list[SeenTensor]]:
    """Return (X shards, y shards) from split_batch's result."""
    if not (isinstance(seen, list | tuple) and len(seen) == 2):
        raise Fail(
            _("split_batch returned {got}, expected a pair (X shards, y shards)").format(
                got=short(seen)
            )
        )
    return shards_of(seen[0], "X"), shards_of(seen[1], "y")


def shards_seen(seen) -> tuple[list[SeenTensor], list[SeenTensor]]:
    """Return (X shards, y shards) for a check that looks at them; a result that is no pair
    of shard lists shows nothing to look at (book_demo_gives_rows_0_1_and_2_3 judges it)."""
    try:
        return pair_of(seen)
    except Fail:
        raise Unobserved(
            "book_demo_gives_rows_0_1_and_2_3",
            N_("split_batch returned no pair of shard lists to look at"),
        ) from None


def numbered_batch(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return X whose row i is filled with i, and labels 100 + i, so every row can be traced."""
    X = torch.arange(rows, dtype=torch.float32).reshape(rows, 1, 1, 1).expand(rows, 1, 2, 2)
    return X.contiguous(), torch.arange(rows) + 100


@case
def book_demo(student, ctx):
    """The book's demo: torch.arange(20).reshape(4, 5) over two devices."""
    return student.fn(torch.arange(20).reshape(4, 5), torch.arange(4), ctx.devices[:2])


@case
def uneven_batches(student, ctx):
    """5 rows over 2 devices, 7 rows over 3 and 8 rows over 4, every row numbered; each call
    on its own, so that one that raises costs only the checks about its batch."""
    fn = student.fn
    results = []
    for rows, k in UNEVEN:
        X, y = numbered_batch(rows)
        results.append(attempt(fn, X, y, cycle(ctx.devices, k)))
    return results


@case
def given_batches(student, ctx, batches: list[tuple[torch.Tensor, torch.Tensor, int]]):
    """The (X, y, number of devices) batches the grader sends, each split once, on its own."""
    fn = student.fn
    return [attempt(fn, X, y, cycle(ctx.devices, k)) for X, y, k in batches]


@case
def mismatched_lengths(student, ctx):
    """Four examples with three labels; then four with four, which must be split."""
    split_batch = student.fn  # a missing function is not a rejection
    right = attempt(split_batch, torch.zeros(4, 3), torch.zeros(4), ctx.devices[:2])
    try:
        result = split_batch(torch.zeros(4, 3), torch.zeros(3), ctx.devices[:2])
    except NotImplementedError:
        raise
    except Exception as error:
        return {"raised": type(error).__name__, "message": str(error), "right": right}
    return {"raised": None, "message": "", "right": right, "result": result}


@check_on(
    book_demo,
    points=1,
    hint="Split X and y along dimension 0, one chunk per device, as nn.parallel.scatter "
    "or d2l.scatter does.",
)
def book_demo_gives_rows_0_1_and_2_3(seen, ctx):
    """torch.arange(20).reshape(4, 5) over two devices gives rows 0-1 and rows 2-3.
    Property: the book's demo; against the reference (its known output)."""
    xs, ys = pair_of(seen)
    data = torch.arange(20).reshape(4, 5)
    # The demo's rows in other shards, or in another order, are the slips the checks of the
    # sizes and of the order charge on the numbered batches.
    rows = [r.tolist() for x in xs if x.value.dim() == 2 for r in x.value]
    owner = None
    if rows == data.tolist():
        owner = "shard_sizes_follow_torch_chunk"
    elif sorted(rows) == data.tolist():
        owner = "shards_keep_the_row_order"
    expect(
        len(xs) == 2,
        _("it made {count} X shards for 2 devices").format(count=len(xs)),
        see=owner,
    )
    expect_equal(xs[0], data[:2], _("the first X shard"), see=owner)
    expect_equal(xs[1], data[2:], _("the second X shard"), see=owner)


def chunk_sizes(rows: int, k: int) -> list[int]:
    """Return the sizes torch.chunk (and nn.parallel.scatter) gives `rows` rows over k."""
    return [len(c) for c in torch.chunk(torch.arange(rows), k)]


def even_sizes(rows: int, k: int) -> list[int]:
    """Return the sizes of the most even split of `rows` rows over k (torch.tensor_split's)."""
    return [len(c) for c in torch.tensor_split(torch.arange(rows), k)]


def sizes_fit(sizes: list[int], rows: int, k: int) -> bool:
    """Return True for shard sizes that split `rows` rows over k devices as the exercise
    allows: torch.chunk's, or k shards of every row that differ by at most one row (in any
    order, as tensor_split or numpy's array_split make them)."""
    if sizes == chunk_sizes(rows, k):
        return True
    return len(sizes) == k and sum(sizes) == rows and max(sizes) - min(sizes) <= 1


def expect_sizes(sizes: list[int], rows: int, k: int, see: str | None = None) -> None:
    """Fail unless `sizes` split `rows` rows over k devices as the exercise allows."""
    expect(
        sizes_fit(sizes, rows, k),
        _(
            "{rows} rows over {k} devices gave shards of {sizes}, expected torch.chunk's "
            "{wanted} or shards as even as can be, {even}"
        ).format(
            rows=rows, k=k, sizes=sizes, wanted=chunk_sizes(rows, k), even=even_sizes(rows, k)
        ),
        see=see,
    )


@check_on(
    uneven_batches,
    points=1,
    hint="Give every row to one shard, one shard per device, with torch.chunk's sizes (as "
    "nn.parallel.scatter does: 7 rows over 3 devices give 3, 3 and 1) or sizes as even as can "
    "be (as torch.tensor_split does: 3, 2 and 2).",
)
def shard_sizes_follow_torch_chunk(seen, ctx):
    """5 rows over 2 devices, 7 over 3 and 8 over 4 give one shard per device, every row in
    one shard, with torch.chunk's sizes (7 over 3: 3, 3 and 1) or as even as can be (3, 2, 2).
    Property: the shards' sizes; against the reference (torch.chunk's sizes, and the even ones
    the exercise allows as well: every row in one shard, which is what the later steps need)."""
    # A batch the code refuses (as MXNet's even split does) has no sizes: the error is
    # charged here, and the other checks judge the batches that were split.
    for i in finished(seen):
        (rows, k), result = UNEVEN[i], seen[i].returned
        xs, _ys = pair_of(result)
        expect_sizes([x.shape[0] if x.shape else 0 for x in xs], rows, k)
    all_finished(seen)


@check_on(
    uneven_batches,
    points=1,
    hint="Take contiguous rows in order; do not shuffle or interleave.",
)
def shards_keep_the_row_order(seen, ctx):
    """Put back together, the X shards are the batch, row for row.
    Property: the rows' order; a relation: the shards put back together against the batch."""
    # Rows left out, the rest in order (shards of the wrong sizes), are the sizes' cause.
    for i in finished(seen):
        (rows, k), result = UNEVEN[i], seen[i].returned
        xs, _ys = shards_seen(result)
        joined = torch.cat([x.value for x in xs]) if xs else torch.empty(0, 1, 2, 2)
        order = joined[:, 0, 0, 0].long().tolist() if joined.dim() == 4 else []
        in_order = order == sorted(set(order)) and len(order) < rows
        expect_equal(
            joined,
            numbered_batch(rows)[0],
            _("{rows} rows over {k} devices, shards joined").format(rows=rows, k=k),
            see="shard_sizes_follow_torch_chunk" if in_order else None,
        )


@check_on(
    uneven_batches,
    points=1,
    hint="Split y exactly as X, so that shard i of y holds the labels of shard i of X.",
)
def labels_stay_with_their_examples(seen, ctx):
    """Shard i of y holds the labels of the rows in shard i of X.
    Property: labels stay with their examples; a relation: y's shards against X's."""
    for i in finished(seen):
        (rows, k), result = UNEVEN[i], seen[i].returned
        xs, ys = shards_seen(result)
        expect(
            len(ys) == len(xs),
            _("{rows} rows over {k} devices: {xs} X shards but {ys} y shards").format(
                rows=rows, k=k, xs=len(xs), ys=len(ys)
            ),
        )
        for j, (x, yy) in enumerate(zip(xs, ys, strict=True)):
            rows_here = x.value[:, 0, 0, 0].long() + 100
            expect_equal(
                yy,
                rows_here,
                _("{rows} rows over {k} devices, y shard {i}").format(rows=rows, k=k, i=j),
            )


@check_on(
    uneven_batches,
    points=1,
    hint="Move shard i of X and of y to devices[i].",
)
def shards_land_on_their_devices(seen, ctx):
    """Shard i of X and of y is on devices[i].
    Property: where the shards are; against the reference (devices[i])."""
    for i in finished(seen):
        (rows, k), result = UNEVEN[i], seen[i].returned
        xs, ys = shards_seen(result)
        wanted = [str(d) for d in cycle(ctx.devices, k)][: len(xs)]
        for name, shards in (("X", xs), ("y", ys)):
            got = [s.device for s in shards]
            expect(
                got == wanted,
                _(
                    "{rows} rows over {k} devices: the {name} shards are on {got}, "
                    "expected {wanted}"
                ).format(rows=rows, k=k, name=name, got=got, wanted=wanted),
            )


@check_on(
    mismatched_lengths,
    points=1,
    hint="Check first that X and y have the same number of rows, and raise an error that "
    "says so, for example: assert X.shape[0] == y.shape[0], f'{X.shape[0]} examples but "
    "{y.shape[0]} labels'.",
)
def rejects_mismatched_lengths_with_a_message(seen, ctx):
    """Four examples with three labels raise an error whose message says what is wrong.
    Property: bad input is refused; against the reference (an error with a message)."""
    observe(
        raised_in(seen["right"]) is None,
        "book_demo_gives_rows_0_1_and_2_3",
        N_("a refusal says nothing of lengths where a right batch is refused too"),
    )
    expect(
        seen["raised"] is not None,
        _(
            "4 examples with 3 labels were split without complaint; the shards would pair "
            "examples with the wrong labels"
        ),
    )
    expect(
        seen["message"].strip() != "",
        _("it raised {error} with an empty message; say what did not match").format(
            error=seen["raised"]
        ),
    )


@error_hints
def diagnose(raised):
    """Name the mistakes that show up as exceptions."""
    if "Expected a non cpu device" in raised.message:
        return _(
            "nn.parallel.scatter needs GPUs or the lab's stand-in devices, and these devices "
            "are the CPU (DPLAB_DEVICES=cpu): use d2l.scatter(X, devices), which splits the "
            "same way on any device."
        )
    if (
        raised.type == "AttributeError"
        and "'Tensor' object has no attribute 'devices'" in raised.message
    ):
        return _("Look for a '.' typed where a ',' was meant, as in `y. devices`.")
    return None

"""Known wrong versions of `split_batch`."""

from grader.exercises.catalogue import Mistake

dot_for_comma = Mistake(
    source="""
def split_batch(X, y, devices):
    assert len(X) == len(y), 'X and y differ in length'
    X = d2l.scatter(X, devices)
    y = d2l.scatter(y. devices)
    return X, y
""",
    fails="book_demo_gives_rows_0_1_and_2_3",
    hint_mentions="'.' typed where a ',' was meant",
    seen_in="seed notes: nn.parallel.scatter(y. devices)",
)

drops_the_remainder = Mistake(
    source="""
def split_batch(X, y, devices):
    assert len(X) == len(y), 'X and y differ in length'
    size = X.shape[0] // len(devices)
    xs = [X[i * size:(i + 1) * size].to(d) for i, d in enumerate(devices)]
    ys = [y[i * size:(i + 1) * size].to(d) for i, d in enumerate(devices)]
    return xs, ys
""",
    fails="shard_sizes_follow_torch_chunk",
    hint_mentions="Give every row to one shard",
    seen_in="shards of X.shape[0] // len(devices) rows: the rows left over are never trained on",
)

assert_without_message = Mistake(
    source="""
def split_batch(X, y, devices):
    assert X.shape[0] == y.shape[0]
    return (d2l.scatter(X, devices), d2l.scatter(y, devices))
""",
    fails="rejects_mismatched_lengths_with_a_message",
    hint_mentions="raise an error that says so",
    seen_in="the book's code",
)

labels_left_whole = Mistake(
    source="""
def split_batch(X, y, devices):
    assert X.shape[0] == y.shape[0], 'X and y differ in length'
    return d2l.scatter(X, devices), [y.to(d) for d in devices]
""",
    fails="labels_stay_with_their_examples",
    hint_mentions="Split y exactly as X",
)

shards_left_on_the_cpu = Mistake(
    source="""
def split_batch(X, y, devices):
    assert X.shape[0] == y.shape[0], 'X and y differ in length'
    return list(torch.chunk(X, len(devices))), list(torch.chunk(y, len(devices)))
""",
    fails="shards_land_on_their_devices",
    hint_mentions="Move shard i of X and of y to devices[i]",
)

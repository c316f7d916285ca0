"""Known wrong versions of `ring_allreduce`, from one template of a right ring."""

from grader.exercises.catalogue import Mistake, variant

TEMPLATE = """
def ring_allreduce(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        return tensor
    <<FLAT>>
    <<CHUNKS>>
    right, left = (rank + 1) % world, (rank - 1) % world
    buffer = torch.empty_like(chunks[0])

    def exchange(send, receive_into):
        <<EXCHANGE>>

    for step in range(world - 1):
        i = (rank - step - 1) % world
        incoming = buffer[: chunks[i].numel()]
        exchange(chunks[(rank - step) % world], incoming)
        chunks[i] += incoming
    <<GATHER>>
    <<BACK>>
    return tensor
"""

RIGHT = {
    "FLAT": "flat = tensor.view(-1)",
    "CHUNKS": "chunks = list(flat.tensor_split(world))",
    "EXCHANGE": """request = dist.isend(send, right) if send.numel() else None
        if receive_into.numel():
            dist.recv(receive_into, left)
        if request is not None:
            request.wait()""",
    "GATHER": """for step in range(world - 1):
        exchange(chunks[(rank + 1 - step) % world], chunks[(rank - step) % world])""",
    "BACK": "",
}

stops_after_the_reduce_scatter = Mistake(
    source=variant(TEMPLATE, RIGHT, GATHER=""),
    fails="every_rank_holds_the_sum",
    hint_mentions="Only the reduce-scatter ran",
)

chunks_assume_the_length_divides = Mistake(
    source=variant(
        TEMPLATE,
        RIGHT,
        CHUNKS="""size = flat.numel() // world
    chunks = [flat[i * size:(i + 1) * size] for i in range(world)]""",
    ),
    fails="sums_tensors_of_any_length",
    hint_mentions="tensor_split",
)

every_rank_sends_first = Mistake(
    source=variant(
        TEMPLATE,
        RIGHT,
        EXCHANGE="""if send.numel():
            dist.send(send, right)
        if receive_into.numel():
            dist.recv(receive_into, left)""",
    ),
    fails="every_rank_holds_the_sum",
    hint_mentions="blocking send",
    seen_in="the first ring most people write: each rank sends, then receives",
)

sums_with_all_reduce = Mistake(
    source="""
def ring_allreduce(tensor):
    dist.all_reduce(tensor)
    return tensor
""",
    fails="uses_only_point_to_point_calls",
    hint_mentions="only point-to-point",
)

passes_the_whole_tensor_around = Mistake(
    source="""
def ring_allreduce(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    passing, incoming = tensor.clone(), torch.empty_like(tensor)
    for _ in range(world - 1):
        request = dist.isend(passing, (rank + 1) % world)
        dist.recv(incoming, (rank - 1) % world)
        request.wait()
        tensor += incoming
        passing = incoming.clone()
    return tensor
""",
    fails="each_rank_sends_two_n_minus_one_chunks",
    hint_mentions="chunks of 1/world_size",
    seen_in="a ring that is right but sends N - 1 whole tensors instead of 2 (N - 1) chunks",
)

sums_into_a_copy = Mistake(
    source=variant(TEMPLATE, RIGHT, FLAT="flat = tensor.flatten().clone()"),
    fails="every_rank_holds_the_sum",
    hint_mentions="came back unchanged",
)

sums_in_float32 = Mistake(
    source=variant(
        TEMPLATE,
        RIGHT,
        FLAT="flat = tensor.view(-1).float()",
        BACK="tensor.copy_(flat.view_as(tensor))",
    ),
    fails="keeps_dtypes_and_sums_integers_exactly",
    hint_mentions="never go through float32",
    seen_in="a ring that sums a float32 copy and writes it back: large int64 values round",
)

receives_into_a_float32_buffer = Mistake(
    source=variant(TEMPLATE, RIGHT).replace(
        "buffer = torch.empty_like(chunks[0])", "buffer = torch.empty(chunks[0].numel())"
    ),
    fails="keeps_dtypes_and_sums_integers_exactly",
    hint_mentions="the buffer must have the tensor's dtype",
    seen_in="a receive buffer made with torch.empty(n), float32 whatever the tensor's dtype",
)

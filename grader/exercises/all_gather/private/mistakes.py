"""Known wrong versions of `all_gather`, from one template of a right one."""

from grader.exercises.catalogue import Mistake, variant

TEMPLATE = """
def all_gather(shard, numel):
    rank, world = dist.get_rank(), dist.get_world_size()
    <<RESULT>>
    <<CHUNKS>>
    chunks[rank].copy_(shard.reshape(-1))
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send = chunks[(rank - step <<SHIFT>>) % world]
        receive = chunks[(rank - step <<SHIFT>> - 1) % world]
        request = dist.isend(send, right) if send.numel() else None
        if receive.numel():
            dist.recv(receive, left)
        if request is not None:
            request.wait()
    return result
"""

RIGHT = {
    "RESULT": "result = torch.empty(numel, dtype=shard.dtype)",
    "CHUNKS": "chunks = list(result.tensor_split(world))",
    "SHIFT": "",
}

result_in_float32 = Mistake(
    source=variant(TEMPLATE, RIGHT, RESULT="result = torch.empty(numel)"),
    fails="keeps_dtypes_and_integers_exact",
    hint_mentions="shard's dtype",
)

equal_chunks_assumed = Mistake(
    source=variant(
        TEMPLATE,
        RIGHT,
        CHUNKS="""size = shard.numel()
    chunks = [result[i * size:(i + 1) * size] for i in range(world)]""",
    ),
    fails="works_for_any_length",
    hint_mentions="tensor_split",
    seen_in="every chunk taken as long as this rank's own",
)

gathers_with_the_collective = Mistake(
    source="""
def all_gather(shard, numel):
    world = dist.get_world_size()
    sizes = [len(c) for c in torch.empty(numel).tensor_split(world)]
    parts = [torch.empty(n, dtype=shard.dtype) for n in sizes]
    dist.all_gather(parts, shard.reshape(-1).clone())
    return torch.cat(parts)
""",
    fails="uses_only_point_to_point_calls",
    hint_mentions="only point-to-point",
    seen_in="dist.all_gather, which gloo runs only where the chunks are equal",
    # gloo refuses an all_gather of unequal sizes, so every call of works_for_any_length
    # raises: that check sees no result, and fails without charging.
)

keeps_the_order_of_arrival = Mistake(
    source="""
def all_gather(shard, numel):
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [len(c) for c in torch.empty(numel).tensor_split(world)]
    pieces = [shard.reshape(-1).clone()]
    for step in range(world - 1):
        incoming = torch.empty(sizes[(rank - step - 1) % world], dtype=shard.dtype)
        request = dist.isend(pieces[-1], (rank + 1) % world) if pieces[-1].numel() else None
        if incoming.numel():
            dist.recv(incoming, (rank - 1) % world)
        if request is not None:
            request.wait()
        pieces.append(incoming)
    return torch.cat(pieces)
""",
    fails="every_rank_gets_the_whole_tensor",
    hint_mentions="in the wrong places",
    seen_in="the chunks joined in the order they arrived, not in rank order",
)

passes_the_whole_result_around = Mistake(
    source="""
def all_gather(shard, numel):
    rank, world = dist.get_rank(), dist.get_world_size()
    result = torch.zeros(numel, dtype=shard.dtype)
    result.tensor_split(world)[rank].copy_(shard.reshape(-1))
    incoming = torch.empty_like(result)
    for step in range(world - 1):
        request = dist.isend(result, (rank + 1) % world)
        dist.recv(incoming, (rank - 1) % world)
        request.wait()
        chunk = (rank - step - 1) % world
        result.tensor_split(world)[chunk].copy_(incoming.tensor_split(world)[chunk])
    return result
""",
    fails="exchanges_one_chunk_per_step_with_its_neighbours",
    hint_mentions="never the whole tensor",
    seen_in="the whole result passed on at each step, one new chunk read from it",
)

sends_its_shard_to_every_rank = Mistake(
    source="""
def all_gather(shard, numel):
    rank, world = dist.get_rank(), dist.get_world_size()
    result = torch.empty(numel, dtype=shard.dtype)
    chunks = result.tensor_split(world)
    chunks[rank].copy_(shard.reshape(-1))
    requests = [dist.isend(chunks[rank], peer)
                for peer in range(world) if peer != rank and chunks[rank].numel()]
    for peer in range(world):
        if peer != rank and chunks[peer].numel():
            dist.recv(chunks[peer], peer)
    for request in requests:
        request.wait()
    return result
""",
    fails="exchanges_one_chunk_per_step_with_its_neighbours",
    hint_mentions="two neighbours only",
    seen_in="all-to-all by sends: the shard sent straight to every other rank",
)

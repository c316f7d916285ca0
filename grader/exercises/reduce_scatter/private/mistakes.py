"""Known wrong versions of `reduce_scatter`, from one template of a right one."""

from grader.exercises.catalogue import Mistake, variant

TEMPLATE = """
def reduce_scatter(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    <<CHUNKS>>
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(world - 1):
        send = chunks[(rank - step <<SHIFT>>) % world]
        receive = chunks[(rank - step <<SHIFT>> - 1) % world]
        <<BUFFER>>
        <<EXCHANGE>>
        receive += incoming
    <<RETURN>>
"""

RIGHT = {
    "CHUNKS": "chunks = [c.clone() for c in tensor.reshape(-1).tensor_split(world)]",
    "SHIFT": "- 1",
    "RETURN": "return chunks[rank]",
    "BUFFER": "incoming = torch.empty_like(receive)",
    "EXCHANGE": """request = dist.isend(send, right) if send.numel() else None
        if incoming.numel():
            dist.recv(incoming, left)
        if request is not None:
            request.wait()""",
}

steps_of_the_all_reduce = Mistake(
    source=variant(TEMPLATE, RIGHT, SHIFT="", RETURN="return chunks[(rank + 1) % world]"),
    fails="each_rank_gets_its_chunk_of_the_sum",
    hint_mentions="another rank's chunk",
    seen_in="the reduce-scatter half of the distributed notebook's ring, copied as it was",
)

chunks_with_chunk = Mistake(
    source=variant(
        TEMPLATE,
        RIGHT,
        CHUNKS="""chunks = [c.clone() for c in tensor.reshape(-1).chunk(world)]
    chunks += [tensor.new_empty(0)] * (world - len(chunks))""",
    ),
    fails="works_for_any_length",
    hint_mentions="tensor_split",
    seen_in="torch.chunk, whose chunks differ from tensor_split's when N does not divide",
)

float_buffer = Mistake(
    source=variant(TEMPLATE, RIGHT, BUFFER="incoming = torch.zeros(receive.numel())"),
    fails="keeps_dtypes_and_sums_integers_exactly",
    hint_mentions="dtype",
)

reduce_scatters_with_the_collective = Mistake(
    source="""
def reduce_scatter(tensor):
    total = tensor.clone()
    dist.all_reduce(total)
    return total.reshape(-1).tensor_split(dist.get_world_size())[dist.get_rank()].clone()
""",
    fails="uses_only_point_to_point_calls",
    hint_mentions="only point-to-point",
)

sends_the_whole_tensor = Mistake(
    source="""
def reduce_scatter(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    passing = tensor.reshape(-1).clone()
    total, incoming = passing.clone(), torch.empty_like(passing)
    for _ in range(world - 1):
        request = dist.isend(passing, (rank + 1) % world)
        dist.recv(incoming, (rank - 1) % world)
        request.wait()
        total += incoming
        passing = incoming.clone()
    return total.tensor_split(world)[rank]
""",
    fails="exchanges_one_chunk_per_step_with_its_neighbours",
    hint_mentions="never the whole tensor",
    seen_in="the whole-tensor ring of PyTorch's tutorial, cut at the end",
)

sends_each_chunk_straight_to_its_owner = Mistake(
    source="""
def reduce_scatter(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = tensor.reshape(-1).tensor_split(world)
    total = chunks[rank].clone()
    requests = [dist.isend(chunks[peer].contiguous(), peer)
                for peer in range(world) if peer != rank and chunks[peer].numel()]
    for peer in range(world):
        if peer != rank and total.numel():
            incoming = torch.empty_like(total)
            dist.recv(incoming, peer)
            total += incoming
    for request in requests:
        request.wait()
    return total
""",
    fails="exchanges_one_chunk_per_step_with_its_neighbours",
    hint_mentions="two neighbours only",
    seen_in="all-to-all by sends: each chunk sent straight to the rank that owns it",
)

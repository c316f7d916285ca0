"""Known wrong versions of `memory_per_rank`, from one template of a right one."""

from grader.exercises.catalogue import Mistake, variant

TEMPLATE = """
def memory_per_rank(model, optimizer, stage, world_size):
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, not {stage}")
    <<PARAMS>>
    total = sum(p.numel() for p in params)
    <<KEPT>>
    per_value = kept // total
    <<SHARD>>
    weights = shard if stage >= 3 else total
    <<GRADS>>
    state = per_value * (shard if stage >= 1 else total)
    return (weights + grads + state) * params[0].element_size()
"""

RIGHT = {
    "PARAMS": "params = [p for p in model.parameters() if p.requires_grad]",
    "KEPT": """kept = sum(t.numel() for p in params for t in optimizer.state[p].values()
               if torch.is_tensor(t) and t.shape == p.shape)""",
    "SHARD": "shard = -(-total // world_size)",
    "GRADS": "grads = shard if stage >= 2 else total",
}

counts_the_step_counters = Mistake(
    source="""
def memory_per_rank(model, optimizer, stage, world_size):
    if stage not in (0, 1, 2, 3):
        raise ValueError("stage must be 0, 1, 2 or 3")
    params = [p for p in model.parameters() if p.requires_grad]
    total = sum(p.numel() for p in params)
    state = sum(t.numel() for s in optimizer.state.values() for t in s.values()
                if torch.is_tensor(t))
    def share(n):
        return -(-n // world_size)
    held = (share(total) if stage >= 3 else total) + (share(total) if stage >= 2 else total)
    held += share(state) if stage >= 1 else state
    return held * 4
""",
    fails="ddp_holds_everything_on_every_rank",
    hint_mentions="`step` counter",
    seen_in="summing every tensor of the state, Adam's scalar step counters included",
)

floors_the_chunk = Mistake(
    source=variant(TEMPLATE, RIGHT, SHARD="shard = total // world_size"),
    fails="rank_0_holds_the_largest_chunk",
    hint_mentions="ceil(P / N)",
)

keeps_whole_gradients_in_stage_2 = Mistake(
    source=variant(TEMPLATE, RIGHT, GRADS="grads = shard if stage >= 3 else total"),
    fails="stage_2_shards_the_gradients_too",
    hint_mentions="stage 2 also ceil(P / N) gradients",
)

counts_every_parameter = Mistake(
    source=variant(TEMPLATE, RIGHT, PARAMS="params = list(model.parameters())"),
    fails="counts_only_what_trains",
    hint_mentions="requires_grad",
)

counts_the_buffers_too = Mistake(
    source=variant(TEMPLATE, RIGHT)
    .replace(
        "total = sum(p.numel() for p in params)",
        "total = sum(p.numel() for p in params)\n"
        "    buffers = sum(b.numel() for b in model.buffers() if b.is_floating_point())",
    )
    .replace("return (weights", "return (buffers + weights"),
    fails="counts_only_what_trains",
    hint_mentions="buffers",
    seen_in="batch norm's running statistics counted as parameters",
)

accepts_any_stage = Mistake(
    source="""
def memory_per_rank(model, optimizer, stage, world_size):
    params = [p for p in model.parameters() if p.requires_grad]
    total = sum(p.numel() for p in params)
    kept = sum(t.numel() for p in params for t in optimizer.state[p].values()
               if torch.is_tensor(t) and t.shape == p.shape)
    shard = -(-total // world_size)
    held = [shard if stage >= 3 else total, shard if stage >= 2 else total,
            kept // total * (shard if stage >= 1 else total)]
    return sum(held) * params[0].element_size()
""",
    fails="rejects_a_stage_that_does_not_exist",
    hint_mentions="ValueError",
)

adam_state_assumed = Mistake(
    source=variant(TEMPLATE, RIGHT, KEPT="kept = 2 * total"),
    fails="ddp_holds_everything_on_every_rank",
    hint_mentions="K is 2 for Adam",
    seen_in="the ZeRO paper's K fixed for Adam, whatever the optimizer",
    hints_never=("`step` counter",),
)

shards_the_gradients_in_stage_1 = Mistake(
    source=variant(TEMPLATE, RIGHT, GRADS="grads = shard if stage >= 1 else total"),
    fails="stage_1_shards_the_optimizer_state",
    hint_mentions="stage 1 holds",
    seen_in="stages 1 and 2 taken for one (both reduce-scatter the gradient)",
)

keeps_whole_parameters_in_stage_3 = Mistake(
    source=variant(TEMPLATE, RIGHT).replace(
        "weights = shard if stage >= 3 else total", "weights = total"
    ),
    fails="stage_3_shards_the_parameters_too",
    hint_mentions="stage 3 also ceil(P / N)",
)

four_bytes_a_value = Mistake(
    source=variant(TEMPLATE, RIGHT).replace("* params[0].element_size()", "* 4"),
    fails="reads_the_state_and_the_bytes_from_what_it_is_given",
    hint_mentions="element_size()",
    seen_in="float32 taken for granted",
)

adds_one_to_the_chunk = Mistake(
    source=variant(TEMPLATE, RIGHT, SHARD="shard = total // world_size + 1"),
    fails="rank_0_holds_the_largest_chunk",
    hint_mentions="P // N + 1",
    seen_in="ceil(P / N) written as P // N + 1, one too many where N divides P",
)

divides_into_a_fraction = Mistake(
    source=variant(TEMPLATE, RIGHT, SHARD="shard = total / world_size"),
    fails="rank_0_holds_the_largest_chunk",
    hint_mentions="ceil(P / N)",
    seen_in="P / N, a fraction of a value where N does not divide P",
)

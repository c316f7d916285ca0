"""Known wrong versions of `allreduce`."""

from grader.exercises.catalogue import Mistake

rebinds_list_entries = Mistake(
    source="""
def allreduce(data):
    for i in range(1, len(data)):
        data[0][:] += data[i].to(data[0].device)
    for i in range(1, len(data)):
        data[i] = data[0].to(data[i].device)
""",
    fails="writes_into_the_tensors_it_was_given",
    hint_mentions="data[i][:] = ...",
    seen_in="seed notes and a published solution: the demo still prints [[3., 3.]] twice",
)

adds_only_the_second_tensor = Mistake(
    source="""
def allreduce(data):
    data[0][:] += data[1].to(data[0].device)
    for i in range(1, len(data)):
        data[i][:] = data[0].to(data[i].device)
""",
    fails="every_tensor_holds_the_sum",
    hint_mentions="Loop over all of data",
)

sums_through_float32 = Mistake(
    source="""
def allreduce(data):
    total = sum(t.float().cpu() for t in data)
    for t in data:
        t[:] = total.to(t.device)
""",
    fails="keeps_dtypes_and_sums_integers_exactly",
    hint_mentions="Keep each tensor's dtype",
)

forgets_the_move = Mistake(
    source="""
def allreduce(data):
    for i in range(1, len(data)):
        data[0][:] += data[i]
    for i in range(1, len(data)):
        data[i][:] = data[0]
""",
    fails="every_tensor_holds_the_sum",
    hint_mentions="Move each tensor to data[0]'s device",
    seen_in="code that ran on one device (or on the CPU repeated), and fails on two GPUs",
)

NOT_MADE = ("Python floats", "`data[i] = ...`")  # hints of other mistakes

never_copies_the_sum_back = Mistake(
    source="""
def allreduce(data):
    for i in range(1, len(data)):
        data[0][:] += data[i].to(data[0].device)
""",
    fails="every_tensor_holds_the_sum",
    hint_mentions="copy the total back",
    hints_never=NOT_MADE,
    seen_in="a lab trial: the first half of the book's loop only",
)

calls_the_device_attribute = Mistake(
    source="""
def allreduce(data):
    device = data[0].device()
    for i in range(1, len(data)):
        data[0][:] += data[i].to(device)
    for i in range(1, len(data)):
        data[i][:] = data[0].to(data[i].device)
""",
    fails="writes_into_the_tensors_it_was_given",
    hint_mentions="Fix the error first",
    hints_never=NOT_MADE,
    seen_in="every call raises TypeError: no check has anything to judge",
)

crashes_on_every_list_of_two = Mistake(
    source="""
def allreduce(data):
    for i in range(1, len(data)):
        data[0][:] += data[i]
    for i in range(1, len(data)):
        data[i][:] = data[0].to(data[i].device)
""",
    fails="every_tensor_holds_the_sum",
    hint_mentions="Move each tensor to data[0]'s device",
    hints_never=NOT_MADE,
    seen_in="a lab trial: only the list of one tensor finished, and had earned "
    "writes_into_the_tensors_it_was_given, which now sees no finished call to judge",
)

shares_the_total_through_data = Mistake(
    source="""
def allreduce(data):
    for i in range(1, len(data)):
        data[0][:] += data[i].to(data[0].device)
    for i in range(1, len(data)):
        data[i].data = data[0].to(data[i].device)
""",
    fails="no_two_results_share_memory",
    hint_mentions="data[i].data = ...",
    seen_in="code that assigns .data to write in place: on the same device, .to() returns "
    "the total itself, so two gradients become one tensor",
)

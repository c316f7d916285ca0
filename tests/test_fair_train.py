"""The from-scratch step and loop: one cause costs one check, and right code by any route
keeps full marks. The step's checks but one compare the code with itself (unequal shards
against one device, four devices against two), so a step that is wrong the same way
everywhere costs the one check that compares it with plain SGD."""

import pytest

from grader.exercises.catalogue import variant
from grader.exercises.train_loop.private import mistakes as loop
from grader.manifest import load_manifest
from tests.conftest import grade_source, verdicts_of_source

MANIFEST = load_manifest()

STEP = """
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    for X_shard, y_shard, W in zip(X_shards, y_shards, device_params):
        loss(lenet(X_shard, W), y_shard).sum().backward()
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([W[i].grad for W in device_params])
    for W in device_params:
        d2l.sgd(W, <<LR>>, <<SIZE>>)
"""

# (the step's learning rate, what it divides by, the one check that must charge it)
STEPS = {
    # wrong by the same factor on any split: only the reference check sees it
    "twice_the_learning_rate": ("2 * lr", "X.shape[0]", "every_replica_matches_one_sgd_step"),
    # depends on the number of devices, on even shards too: the reference check's
    "divides_by_the_devices_too": (
        "lr",
        "X.shape[0] * len(devices)",
        "every_replica_matches_one_sgd_step",
    ),
    # right wherever the shards are equal: only the check of unequal shards sees it
    "the_last_shard_times_the_devices": (
        "lr",
        "len(devices) * X_shards[-1].shape[0]",
        "uneven_split_steps_as_one_device_does",
    ),
}


@pytest.mark.train_batch
@pytest.mark.parametrize("name", sorted(STEPS))
def test_a_wrong_step_costs_one_check(name):
    """Each of these steps, outside the catalogue, loses the points of one check only."""
    lr, size, owner = STEPS[name]
    source = STEP.replace("<<LR>>", lr).replace("<<SIZE>>", size)
    verdicts = verdicts_of_source(MANIFEST.exercise("train_batch"), source)
    charged = {v.result.name: v.result.message for v in verdicts if v.charged}
    assert set(charged) == {owner}, charged


RIGHT_LOOP = variant(loop.BOOK, loop.RIGHT)
COPIES = "device_params = [get_params(params, d) for d in devices]"

# Right loops that make their replicas another way than one get_params call per device.
LOOPS = {
    "copies_with_to": RIGHT_LOOP.replace(
        COPIES,
        "device_params = [[p.detach().to(d, copy=True).requires_grad_() for p in params]\n"
        "                     for d in devices]",
    ),
    "resynchronises_each_epoch": RIGHT_LOOP.replace(
        "        timer.start()\n",
        "        timer.start()\n"
        "        device_params = [get_params(device_params[0], d) for d in devices]\n",
    ),
    "evaluates_a_copy_of_the_first_replica": RIGHT_LOOP.replace(
        "lambda x: lenet(x, device_params[0])",
        "lambda x, W=get_params(device_params[0], devices[0]): lenet(x, W)",
    ),
}


@pytest.mark.train_loop
@pytest.mark.parametrize("name", sorted(LOOPS))
def test_a_loop_that_makes_its_replicas_another_way_gets_full_marks(name):
    assert LOOPS[name] != RIGHT_LOOP
    result = grade_source(MANIFEST.exercise("train_loop"), LOOPS[name])
    failed = {c.name: c.message for c in result.checks if not c.passed}
    assert result.score == result.max_score, failed

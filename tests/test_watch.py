"""What the grading child and its ranks watch in themselves: a run that replaces the grader's
code or torch.distributed is seen, and what torch does by itself is not. And the launcher's
one shortcut into torch: the search for third-party backends answered from the first one."""

import importlib.metadata
import types
import warnings

import pytest
import torch
import torch.distributed as dist

import grader.base.inputs
from grader.base.tampering import TORCH_FUNCTIONS, Snapshot, counted_attributes, watched_objects
from grader.ranks import plugins


def fingerprint(watched: dict[str, object]) -> dict[str, int]:
    """The watch written the slow, plain way, for the snapshot to agree with: the identity of
    every attribute (and function body) that counts, by name."""
    marks = {f"torch.{name}": id(getattr(torch, name)) for name in TORCH_FUNCTIONS}
    for name, obj in watched.items():
        for attribute, value in counted_attributes(name, obj).items():
            marks[f"{name}.{attribute}"] = id(value)
            if type(value) is types.FunctionType:
                marks[f"{name}.{attribute}.__code__"] = id(value.__code__)
    return marks


@pytest.fixture
def watched() -> dict[str, object]:
    return watched_objects()


def test_a_snapshot_names_an_attribute_replaced_then_put_back_as_unchanged(watched):
    snapshot = Snapshot(watched)
    assert snapshot.changed() == []
    original = grader.base.inputs.sgd_step
    grader.base.inputs.sgd_step = lambda params, lr: None
    try:
        assert snapshot.changed() == ["grader.base.inputs.sgd_step"]
    finally:
        grader.base.inputs.sgd_step = original
    assert snapshot.changed() == []


def test_a_snapshot_names_a_function_whose_body_was_swapped_and_one_that_is_gone(watched):
    snapshot = Snapshot(watched)
    code = grader.base.inputs.sgd_step.__code__
    grader.base.inputs.sgd_step.__code__ = (lambda params, lr: None).__code__
    try:  # named wherever the function is bound (a checks module may import it by name)
        changed = snapshot.changed()
        assert "grader.base.inputs.sgd_step" in changed
        assert all(name.endswith(".sgd_step") for name in changed), changed
    finally:
        grader.base.inputs.sgd_step.__code__ = code
    all_reduce = dist.all_reduce
    del dist.all_reduce
    try:
        assert snapshot.changed() == ["torch.distributed.all_reduce"]
    finally:
        dist.all_reduce = all_reduce
    assert snapshot.changed() == []


def test_a_snapshot_sees_what_torch_and_builtins_point_to(watched):
    snapshot = Snapshot(watched)
    save = torch.save
    torch.save = lambda *args, **kwargs: None
    try:
        assert snapshot.changed() == ["torch.save"]
        changes = snapshot.changes()
        assert changes == {"torch.save": id(torch.save)}
    finally:
        torch.save = save
    import builtins

    real_print = builtins.print
    builtins.print = lambda *args, **kwargs: None
    try:
        assert snapshot.changed() == ["builtins.print"]
    finally:
        builtins.print = real_print


def test_a_plain_value_that_torch_sets_by_itself_is_not_a_change(watched):
    snapshot = Snapshot(watched)
    dist.__dict__["_a_flag_set_lazily"] = True
    try:
        assert snapshot.changed() == []
    finally:
        del dist.__dict__["_a_flag_set_lazily"]


def test_a_snapshot_agrees_with_a_fingerprint_taken_before_and_after(watched):
    before = fingerprint(watched)
    snapshot = Snapshot(watched)
    replaced = {"grader.base.inputs": "quiet_plots", "torch.distributed": "broadcast"}
    originals = {name: getattr(watched[name], a) for name, a in replaced.items()}
    for name, attribute in replaced.items():
        setattr(watched[name], attribute, types.SimpleNamespace())
    try:
        after = fingerprint(watched)
        by_ids = sorted(
            {k.removesuffix(".__code__") for k, v in before.items() if after.get(k) != v}
        )
        assert snapshot.changed() == by_ids == sorted(f"{n}.{a}" for n, a in replaced.items())
    finally:
        for name, attribute in replaced.items():
            setattr(watched[name], attribute, originals[name])


def test_watching_raises_no_deprecation_warning(watched):
    # torch.distributed.reduce_op warns whenever its attributes are looked up (isinstance does)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Snapshot(watched).changed()
        fingerprint(watched)


def test_a_process_group_starts_without_searching_the_installed_packages_again(
    tmp_path, monkeypatch
):
    searches = []
    original = importlib.metadata.entry_points

    def counting(**params):
        searches.append(params)
        return original(**params)

    monkeypatch.setattr(importlib.metadata, "entry_points", counting)
    plugins._BACKEND_PLUGINS.clear()  # as in a process that has not looked yet
    plugins.look_up_backend_plugins()
    assert searches == [{"group": plugins.PLUGIN_GROUP}]
    with plugins.backend_plugins_known():
        for _ in range(3):
            store = dist.FileStore(str(tmp_path / "store"), 1)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
            assert dist.get_backend() == "gloo"
            dist.destroy_process_group()
        assert importlib.metadata.entry_points(group="console_scripts") is not None
    assert len([s for s in searches if s == {"group": plugins.PLUGIN_GROUP}]) == 1
    assert importlib.metadata.entry_points is counting  # put back as it was

"""The real CUDA path: these run where there are GPUs and are skipped elsewhere."""

import pytest
import torch

import dplab
from dplab.devices import lab_devices, num_gpus
from dplab.sim.device import backing
from grader.exercises.catalogue import mistakes_of
from grader.manifest import load_manifest
from tests.conftest import fresh_solution, grade_in_process

needs_gpu = pytest.mark.skipif(num_gpus() < 1, reason="needs a CUDA GPU")
needs_two = pytest.mark.skipif(num_gpus() < 2, reason="needs two CUDA GPUs")


@pytest.mark.gpu
@needs_gpu
def test_stand_ins_compute_on_the_gpu_when_there_is_one():
    """One GPU: stand-ins (two distinct devices) whose arithmetic runs on it, in full float32;
    two or more: the GPUs themselves."""
    devices = lab_devices(2)
    if num_gpus() >= 2:
        assert devices == [torch.device("cuda:0"), torch.device("cuda:1")]
        return
    assert [d.type for d in devices] == ["sim", "sim"]
    x = torch.ones(4, 4, device=devices[1]) @ torch.ones(4, 4, device=devices[1])
    assert x.device == devices[1] and backing(x).device.type == "cuda"
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32


@pytest.mark.gpu
@needs_gpu
def test_the_from_scratch_reference_gets_full_marks_on_cuda():
    manifest = load_manifest()
    namespace = fresh_solution("from_scratch.ipynb")
    for ex in manifest.in_notebook("from_scratch.ipynb"):
        result = grade_in_process(ex, namespace)
        assert result.score == result.max_score, [c.message for c in result.checks if not c.passed]


@pytest.mark.multigpu
@needs_two
def test_lab_devices_are_distinct_gpus():
    assert lab_devices(2) == [torch.device("cuda:0"), torch.device("cuda:1")]


@pytest.mark.multigpu
@needs_two
def test_the_books_scatter_works_and_matches_the_labs():
    X = torch.arange(20).reshape(4, 5)
    devices = lab_devices(2)
    book = torch.nn.parallel.scatter(X, devices)
    ours = dplab.scatter(X, devices)
    assert [t.device for t in book] == [t.device for t in ours] == devices
    assert all(torch.equal(a, b) for a, b in zip(book, ours, strict=True))


@pytest.mark.multigpu
@needs_two
def test_data_parallel_reference_gets_full_marks_on_two_gpus():
    ex = load_manifest().exercise("train_dataparallel")
    result = grade_in_process(ex, fresh_solution("concise.ipynb"))
    assert result.score == result.max_score, [c.message for c in result.checks if not c.passed]


@pytest.mark.multigpu
@needs_two
def test_a_shard_left_off_its_device_fails_on_real_gpus():
    ex = load_manifest().exercise("split_batch")
    namespace = fresh_solution("from_scratch.ipynb")
    exec(
        "def split_batch(X, y, devices):\n"
        "    assert len(X) == len(y), 'lengths differ'\n"
        "    return list(torch.chunk(X, len(devices))), list(torch.chunk(y, len(devices)))",
        namespace,
    )
    verdicts = {c.name: c for c in grade_in_process(ex, namespace).checks}
    assert not verdicts["shards_land_on_their_devices"].passed
    assert mistakes_of(ex)  # the catalogue stays in force on GPUs

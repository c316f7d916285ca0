"""Known outputs of the sharded notebook's reference, pinned as the other notebooks' are: the
bytes per rank of the lab's ResNet-18 with Adam (11,175,818 parameters, float32), and the
ring's two halves on the notebook's demo of three processes with seven values each."""

import pytest
import torch

import dplab
from grader.load.reference import reference

# Rank 0's bytes for the concise notebook's ResNet-18 and Adam: DDP, then ZeRO's stages.
RESNET18_ADAM = {
    2: (178_813_088, 134_109_816, 111_758_180, 89_406_544),
    4: (178_813_088, 111_758_184, 78_230_732, 44_703_280),
}


def test_resnet18_with_adam_holds_what_the_zero_paper_says_per_rank():
    net = reference("concise.ipynb")["resnet18"](10)
    adam = torch.optim.Adam(net.parameters(), lr=0.01)
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    adam.step()
    memory_per_rank = reference("sharded.ipynb")["memory_per_rank"]
    assert sum(p.numel() for p in net.parameters()) == 11_175_818
    for world, figures in RESNET18_ADAM.items():
        assert tuple(memory_per_rank(net, adam, s, world) for s in range(4)) == figures
    with pytest.raises(ValueError, match="stage"):
        memory_per_rank(net, adam, 4, 2)


def halves_of_seven():
    import torch.distributed as dist

    names = reference("sharded.ipynb")
    mine = names["reduce_scatter"](torch.arange(7.0) + 10 * dist.get_rank())
    return mine, names["all_gather"](mine, 7)


def test_the_halves_give_each_rank_its_chunk_and_then_the_whole_sum():
    done = dplab.launch(halves_of_seven, nprocs=3, backend="gloo", show=False)
    total = 3 * torch.arange(7.0) + 30
    for rank, (mine, whole) in enumerate(done.results):
        assert torch.equal(mine, total.tensor_split(3)[rank])
        assert torch.equal(whole, total)


def test_the_judges_own_figures_are_torchs():
    """The checks judge without building optimizers (grader.exercises.memory_per_rank's K per
    optimizer, sharded_optimizer's updates): what they assume is what torch.optim does."""
    from grader.exercises.memory_per_rank import checks as memory
    from grader.exercises.sharded_optimizer import checks as sharded

    for name, (_cls, _settings, k) in memory.OPTIMIZERS.items():
        net, opt = memory.stepped("odd", name, seed=3)
        values = sum(t.numel() for s in opt.state.values() for t in s.values() if t.dim())
        assert values == k * memory.table("odd", name).total, name
    for name, (cls, settings, _k) in sharded.OPTIMIZERS.items():
        net = sharded.grad_model(5)
        opt = cls(net.parameters(), **settings)
        for step in range(sharded.STEPS):
            X, y = sharded.global_batch(5 + step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(X), y).backward()
            opt.step()
        mine = sharded._one_process(5, name, False)
        for got, want in zip(mine, net.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-7)

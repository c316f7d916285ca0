"""Known wrong versions of `evaluate_accuracy_distributed`."""

from grader.exercises.catalogue import Mistake

averages_the_accuracies = Mistake(
    source="""
def evaluate_accuracy_distributed(net, test_iter, device):
    net.eval()
    correct, total = 0.0, 0
    with torch.no_grad():
        for X, y in test_iter:
            X, y = X.to(device), y.to(device)
            correct += d2l.accuracy(net(X), y)
            total += y.numel()
    mine = torch.tensor(correct / total, device=device)
    dist.all_reduce(mine)
    return float(mine) / dist.get_world_size()
""",
    fails="every_rank_returns_the_accuracy_of_the_whole_set",
    hint_mentions="averaged over the ranks",
    seen_in="the first idea most people have: average what each rank measured",
)

counts_only_its_own_shard = Mistake(
    source="""
def evaluate_accuracy_distributed(net, test_iter, device):
    return d2l.evaluate_accuracy_gpu(net, test_iter, device)
""",
    fails="every_rank_returns_the_accuracy_of_the_whole_set",
    hint_mentions="dist.all_reduce",
)

returns_a_tensor = Mistake(
    source="""
def evaluate_accuracy_distributed(net, test_iter, device):
    net.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for X, y in test_iter:
            X, y = X.to(device), y.to(device)
            counts[0] += d2l.accuracy(net(X), y)
            counts[1] += y.numel()
    dist.all_reduce(counts)
    return counts[0] / counts[1]
""",
    fails="returns_a_python_float",
    hint_mentions="float(",
)

skips_the_all_reduce_without_data = Mistake(
    source="""
def evaluate_accuracy_distributed(net, test_iter, device):
    net.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for X, y in test_iter:
            X, y = X.to(device), y.to(device)
            counts[0] += d2l.accuracy(net(X), y)
            counts[1] += y.numel()
    if counts[1] == 0:
        return 0.0
    dist.all_reduce(counts)
    return float(counts[0] / counts[1])
""",
    fails="a_rank_without_data_still_takes_part",
    hint_mentions="must still join the all_reduce",
)

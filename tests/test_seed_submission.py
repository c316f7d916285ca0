"""A submission written the way the seed notes are: the book's code, demos, a final training call."""

import json
import subprocess

import pytest

from tests.conftest import note_texts, python, write_notebook

BOOK_STYLE = [
    "%matplotlib inline\nimport torch\nfrom torch import nn\nfrom torch.nn import functional as F\n"
    "from d2l import torch as d2l",
    """
scale = 0.01
W1 = torch.randn(size=(20, 1, 3, 3)) * scale
b1 = torch.zeros(20)
W2 = torch.randn(size=(50, 20, 5, 5)) * scale
b2 = torch.zeros(50)
W3 = torch.randn(size=(800, 128)) * scale
b3 = torch.zeros(128)
W4 = torch.randn(size=(128, 10)) * scale
b4 = torch.zeros(10)
params = [W1, b1, W2, b2, W3, b3, W4, b4]

def lenet(X, params):
    h1_conv = F.conv2d(input=X, weight=params[0], bias=params[1])
    h1 = F.avg_pool2d(input=F.relu(h1_conv), kernel_size=(2, 2), stride=(2, 2))
    h2_conv = F.conv2d(input=h1, weight=params[2], bias=params[3])
    h2 = F.avg_pool2d(input=F.relu(h2_conv), kernel_size=(2, 2), stride=(2, 2))
    h2 = h2.reshape(h2.shape[0], -1)
    h3 = F.relu(torch.mm(h2, params[4]) + params[5])
    return torch.mm(h3, params[6]) + params[7]

loss = nn.CrossEntropyLoss(reduction='none')
""",
    """
def get_params(params, device):
    new_params = [p.to(device) for p in params]
    for p in new_params:
        p.requires_grad_()
    return new_params

new_params = get_params(params, d2l.try_gpu(0))
print('b1 weight:', new_params[1])
print('b1 grad:', new_params[1].grad)
""",
    """
def allreduce(data):
    for i in range(1, len(data)):
        data[0][:] += data[i].to(data[0].device)
    for i in range(1, len(data)):
        data[i][:] = data[0].to(data[i].device)
""",
    """
def split_batch(X, y, devices):
    assert X.shape[0] == y.shape[0]
    return (nn.parallel.scatter(X, devices), nn.parallel.scatter(y, devices))
""",
    """
def train_batch(X, y, device_params, devices, lr):
    X_shards, y_shards = split_batch(X, y, devices)
    ls = [loss(lenet(X_shard, device_W), y_shard).sum()
          for X_shard, y_shard, device_W in zip(X_shards, y_shards, device_params)]
    for l in ls:
        l.backward()
    with torch.no_grad():
        for i in range(len(device_params[0])):
            allreduce([device_params[c][i].grad for c in range(len(devices))])
    for param in device_params:
        d2l.sgd(param, lr, X.shape[0])
""",
    """
def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    device_params = [get_params(params, d) for d in devices]
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    timer = d2l.Timer()
    for epoch in range(num_epochs):
        timer.start()
        for X, y in train_iter:
            train_batch(X, y, device_params, devices, lr)
            torch.cuda.synchronize()
        timer.stop()
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(
            lambda x: lenet(x, device_params[0]), test_iter, devices[0]),))
    print(f'test acc: {animator.Y[0][-1]:.2f}, {timer.avg():.1f} sec/epoch on {str(devices)}')
    return animator.Y[0]
""",
    "train(num_gpus=2, batch_size=256, lr=0.2)",
]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("class") / "alice" / "multigpu"
    write_notebook(folder / "from_scratch.ipynb", *BOOK_STYLE)
    out = folder.parent / "r.json"
    proc = subprocess.run(
        [python(), "-m", "grader", "grade", str(folder), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    (sub,) = json.loads(out.read_text())["submissions"]
    return sub


def exercise(sub, name):
    return next(e for e in sub["exercises"] if e["name"] == name)


def failed(sub, name):
    return {c["name"]: c for c in exercise(sub, name)["checks"] if not c["passed"]}


def test_the_final_training_call_is_not_run(graded):
    sub = graded
    assert any("did not run this call of train(...)" in n for n in note_texts(sub))
    assert sub["id"] == "alice"


def test_a_correct_allreduce_gets_full_marks(graded):
    sub = graded
    assert exercise(sub, "allreduce")["score"] == exercise(sub, "allreduce")["max_score"]


def test_the_books_get_params_is_caught_sharing_memory(graded):
    sub = graded
    fails = failed(sub, "get_params")
    assert "copies_are_independent_of_the_originals" in fails
    assert (
        "returns the very same tensor" in fails["copies_are_independent_of_the_originals"]["hint"]
    )


def test_missing_warm_up_and_notebook_cost_only_their_exercises(graded):
    sub = graded
    assert exercise(sub, "try_gpu")["score"] == 0
    assert "`try_gpu` is not defined" in exercise(sub, "try_gpu")["checks"][0]["message"]
    assert exercise(sub, "resnet18")["score"] == 0
    assert "concise.ipynb is missing" in exercise(sub, "resnet18")["checks"][0]["message"]
    assert any("concise.ipynb is missing" in n for n in note_texts(sub))


def test_the_books_scatter_works_on_stand_in_devices_too(graded):
    sub = graded
    assert set(failed(sub, "split_batch")) == {"rejects_mismatched_lengths_with_a_message"}
    assert exercise(sub, "train_batch")["score"] == exercise(sub, "train_batch")["max_score"]


def test_the_books_loop_with_torch_cuda_synchronize_gets_full_marks(graded):
    sub = graded
    assert failed(sub, "train_loop") == {}

"""The runtime library `dplab`: the d2l-style helpers the notebooks use."""

import gzip
import shutil
import struct
import warnings

import pytest
import torch
from torch import nn

import dplab
import dplab.plot
import grader.base.grading_devices
from dplab import data as fm
from dplab.devices import lab_devices, scatter, synchronize, try_all_gpus, try_gpu

FULL_SET_INSTALLED = any(fm.files_in(d) for d in fm.SYSTEM_DIRS)


# ---- devices ---------------------------------------------------------------------------


def test_lab_devices_are_real_gpus_or_distinct_stand_ins():
    for n in (1, 2, 4):
        devices = lab_devices(n)
        assert len(devices) == n and len(set(devices)) == n
        if torch.cuda.device_count() >= 2:
            assert all(d.type == "cuda" for d in devices)
        else:
            assert devices == [torch.device("sim", i) for i in range(n)]


def test_stand_ins_are_announced_once(capsys, monkeypatch):
    monkeypatch.setattr(dplab.devices, "_told", set())
    monkeypatch.setattr(dplab.devices, "num_gpus", lambda: 0)
    assert try_gpu(1) == torch.device("sim:1")
    try_gpu(3)
    printed = capsys.readouterr().out
    assert printed.count("stand-in devices") == 1
    assert "this machine has no GPU" in printed


@pytest.mark.parametrize(
    ("mode", "gpus", "wanted"),
    [
        ("auto", 0, ["sim:0", "sim:1"]),
        ("auto", 3, ["cuda:0", "cuda:1", "cuda:2"]),
        ("real", 0, ["cpu"]),
        ("real", 1, ["cuda:0"]),
        ("cpu", 4, ["cpu"]),
        ("stand-in", 4, ["sim:0", "sim:1"]),
    ],
)
def test_try_all_gpus_follows_the_device_mode(monkeypatch, mode, gpus, wanted):
    monkeypatch.setenv("DPLAB_DEVICES", mode)
    monkeypatch.setattr(dplab.devices, "num_gpus", lambda: gpus)
    assert [str(d) for d in try_all_gpus()] == wanted


def test_the_number_of_stand_ins_is_the_users_choice(monkeypatch):
    monkeypatch.setenv("DPLAB_DEVICES", "stand-in")
    monkeypatch.setenv("DPLAB_STAND_INS", "4")
    assert [str(d) for d in try_all_gpus()] == ["sim:0", "sim:1", "sim:2", "sim:3"]
    assert dplab.device_count() == 4


def test_cpu_mode_repeats_the_cpu(monkeypatch):
    monkeypatch.setenv("DPLAB_DEVICES", "cpu")
    assert lab_devices(2) == [torch.device("cpu")] * 2


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("DPLAB_DEVICES", "gpus", "DPLAB_DEVICES must be one of auto, real, stand-in, cpu"),
        ("DPLAB_STAND_INS", "two", "DPLAB_STAND_INS must be a whole number"),
    ],
)
def test_bad_settings_are_explained(monkeypatch, name, value, says):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=says):
        lab_devices(2)


def test_scatter_splits_like_torch_chunk_on_any_device():
    X = torch.arange(10).reshape(5, 2)
    shards = scatter(X, [torch.device("cpu")] * 2)
    assert [s.shape[0] for s in shards] == [3, 2]
    assert torch.equal(torch.cat(shards), X)


def test_book_scatter_refuses_the_cpu_which_is_why_the_lab_has_its_own():
    with pytest.raises(ValueError, match="Expected a non cpu device"):
        nn.parallel.scatter(torch.arange(4), [torch.device("cpu")] * 2)


def test_synchronize_is_harmless_without_cuda():
    synchronize(lab_devices(2))
    synchronize()


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the call is PyTorch's own")
def test_the_books_cuda_synchronize_runs_where_the_devices_are_stand_ins():
    devices = lab_devices(2)
    torch.cuda.synchronize()
    torch.cuda.synchronize(devices[1])


def test_the_english_editions_device_helpers(monkeypatch):
    monkeypatch.setattr(dplab.devices, "num_gpus", lambda: 0)
    assert dplab.cpu() == torch.device("cpu")
    assert dplab.gpu(1) == torch.device("sim:1")  # stand-in 1, like try_gpu(1)
    monkeypatch.setenv("DPLAB_DEVICES", "real")
    assert dplab.gpu(1) == torch.device("cuda:1")  # the book's, whether or not it exists


@pytest.mark.parametrize(
    ("mode", "gpus", "wanted"),
    [
        ("cpu", 0, "stand-in"),
        ("auto", 0, "stand-in"),
        ("auto", 1, "stand-in"),
        ("auto", 2, "real"),
        ("stand-in", 4, "stand-in"),
        ("real", 1, "stand-in"),
        ("cpu", 4, "stand-in"),
    ],
)
def test_checks_always_run_on_two_distinct_devices(monkeypatch, mode, gpus, wanted):
    monkeypatch.setenv("DPLAB_DEVICES", mode)
    monkeypatch.setattr(dplab.devices, "num_gpus", lambda: gpus)
    assert grader.base.grading_devices.grading_mode() == wanted


def test_the_exercises_are_not_in_the_labs_d2l():
    with pytest.raises(AttributeError, match="you write `split_batch` yourself"):
        dplab.split_batch  # noqa: B018 (the attribute access is the test)


# ---- the residual block, in either edition's form -------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((64, 128), {"use_1x1conv": True, "strides": 2}),  # d2l 2.0
        ((128,), {"use_1x1conv": True, "strides": 2}),  # d2l 1.0
        ((128, True, 2), {}),
        ((64,), {"num_channels": 128, "use_1x1conv": True, "strides": 2}),
        ((), {"input_channels": 64, "num_channels": 128, "use_1x1conv": True, "strides": 2}),
    ],
)
def test_residual_takes_either_editions_arguments(args, kwargs):
    torch.manual_seed(0)
    block = dplab.Residual(*args, **kwargs)
    out = block(torch.randn(2, 64, 8, 8))
    assert out.shape == (2, 128, 4, 4)
    shapes = [tuple(p.shape) for p in block.parameters()]
    assert shapes == [tuple(p.shape) for p in dplab.Residual(64, 128, True, 2).parameters()]


def test_residual_of_the_english_edition_is_lazy_until_it_runs():
    block = dplab.Residual(32)
    assert isinstance(block.conv1, nn.LazyConv2d)
    block(torch.randn(1, 32, 6, 6))
    assert type(block.conv1) is nn.Conv2d and block.conv1.in_channels == 32


@pytest.mark.parametrize(
    ("args", "kwargs", "says"),
    [
        ((), {}, "needs the number of channels"),
        ((64, 128), {"num_channels": 128}, "got the channels twice"),
        ((64,), {"channels": 3}, "unexpected arguments"),
    ],
)
def test_residual_explains_arguments_it_cannot_take(args, kwargs, says):
    with pytest.raises(TypeError, match=says) as error:
        dplab.Residual(*args, **kwargs)
    assert "Residual(num_channels, use_1x1conv=False, strides=1) (d2l 1.0)" in str(error.value)


# ---- training helpers ---------------------------------------------------------------------


def test_timer_measures_stretches():
    timer = dplab.Timer()
    timer.stop()
    timer.start()
    timer.stop()
    assert len(timer.times) == 2
    assert timer.sum() == pytest.approx(sum(timer.times))
    assert timer.avg() == pytest.approx(timer.sum() / 2)
    assert timer.cumsum()[-1] == pytest.approx(timer.sum())


def test_accumulator_adds_rows():
    acc = dplab.Accumulator(2)
    acc.add(1, 2)
    acc.add(3, torch.tensor(4.0))
    assert (acc[0], acc[1]) == (4.0, 6.0)
    acc.reset()
    assert acc.data == [0.0, 0.0]


def test_sgd_steps_and_zeroes_the_gradient():
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    (w * torch.tensor([3.0, 4.0])).sum().backward()
    dplab.sgd([w], lr=0.5, batch_size=2)
    assert torch.allclose(w, torch.tensor([1.0 - 0.75, 2.0 - 1.0]))
    assert torch.equal(w.grad, torch.zeros(2))


def test_accuracy_counts_correct_predictions():
    y_hat = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    assert dplab.accuracy(y_hat, torch.tensor([1, 1, 1])) == 2.0


def test_evaluate_accuracy_takes_a_module_or_a_function():
    net = nn.Linear(2, 2)
    with torch.no_grad():
        net.weight.copy_(torch.eye(2))
        net.bias.zero_()
    data = [(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 0]))]
    net.train()
    assert dplab.evaluate_accuracy_gpu(net, data) == 0.5
    assert not net.training  # a module is evaluated in eval mode
    assert dplab.evaluate_accuracy_gpu(lambda X: net(X), data, torch.device("cpu")) == 0.5
    with pytest.raises(ValueError, match="pass the device"):
        dplab.evaluate_accuracy_gpu(lambda X: net(X), data)


def test_lenet_maps_images_to_ten_scores():
    params = dplab.lenet_params(seed=0)
    assert [tuple(p.shape) for p in params[::2]] == [
        (20, 1, 3, 3),
        (50, 20, 5, 5),
        (800, 128),
        (128, 10),
    ]
    assert all(not p.requires_grad for p in params)
    assert dplab.lenet(torch.rand(3, 1, 28, 28), params).shape == (3, 10)
    assert torch.equal(dplab.lenet_params(seed=5)[0], dplab.lenet_params(seed=5)[0])


def test_residual_keeps_or_changes_the_shape():
    X = torch.rand(2, 3, 6, 6)
    assert dplab.Residual(3, 3)(X).shape == (2, 3, 6, 6)
    assert dplab.Residual(3, 6, use_1x1conv=True, strides=2)(X).shape == (2, 6, 3, 3)


def test_animator_saves_a_png_when_there_is_no_screen(tmp_path):
    animator = dplab.Animator("epoch", "test acc", xlim=[1, 3], save_to=tmp_path / "curve.png")
    for epoch in range(3):
        animator.add(epoch + 1, (0.5 + 0.1 * epoch,))
    assert animator.Y == [[0.5, 0.6, 0.7]]
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_plot_that_cannot_be_saved_warns_once_and_training_goes_on(tmp_path, capsys):
    (tmp_path / "taken").write_text("a file, not a folder")
    animator = dplab.Animator("epoch", "test acc", save_to=tmp_path / "taken" / "curve.png")
    for epoch in range(3):
        animator.add(epoch + 1, (0.5,))
    assert animator.Y == [[0.5, 0.5, 0.5]]
    said = capsys.readouterr().err
    assert said.count("cannot save the plot") == 1 and "DPLAB_FIGURE_DIR" in said


# ---- Fashion-MNIST ----------------------------------------------------------------------


def test_the_embedded_sample_loads_and_batches():
    train_iter, test_iter = dplab.load_data_fashion_mnist(256, source="sample")
    assert len(train_iter) == 16 and len(test_iter) == 4
    X, y = next(iter(train_iter))
    assert X.shape == (256, 1, 28, 28) and X.dtype == torch.float32
    assert 0 <= float(X.min()) and float(X.max()) <= 1
    assert y.dtype == torch.int64
    counts = torch.bincount(train_iter.labels, minlength=10)
    assert counts.tolist() == [400] * 10


def test_training_batches_are_reshuffled_every_pass():
    train_iter, test_iter = dplab.load_data_fashion_mnist(64, source="sample", subset=(640, 128))
    first, second = next(iter(train_iter))[1], next(iter(train_iter))[1]
    assert not torch.equal(first, second)
    assert torch.equal(next(iter(test_iter))[1], next(iter(test_iter))[1])
    assert sum(len(y) for _, y in train_iter) == 640


def test_resize_gives_bigger_images():
    train_iter, _ = dplab.load_data_fashion_mnist(8, resize=96, source="sample", subset=(8, 8))
    assert next(iter(train_iter))[0].shape == (8, 1, 96, 96)


def test_a_data_limit_keeps_the_first_images_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(fm, "_announced", set())
    monkeypatch.setenv("DPLAB_DATA_LIMIT", "512,128")
    train_iter, test_iter = dplab.load_data_fashion_mnist(64, source="sample")
    train_set, test_set = dplab.fashion_mnist_datasets(source="sample")
    assert len(train_iter) == 8 and len(test_iter) == 2
    assert (len(train_set), len(test_set)) == (512, 128)
    full = fm.embedded_sample()
    assert torch.equal(train_iter.labels, full.train_labels[:512])
    said = capsys.readouterr().out
    assert said.count("keeping the first 512 training and 128 test images") == 1


@pytest.mark.parametrize("value", ["512", "0,10", "a lot,5"])
def test_a_data_limit_that_is_not_two_counts_is_explained(monkeypatch, value):
    monkeypatch.setenv("DPLAB_DATA_LIMIT", value)
    with pytest.raises(ValueError, match="TRAIN,TEST"):
        dplab.load_data_fashion_mnist(64, source="sample")


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """A machine with no copy of Fashion-MNIST anywhere."""
    monkeypatch.setenv("DPLAB_DATA_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("DPLAB_OFFLINE", "1")
    monkeypatch.delenv("DPLAB_FASHION_MNIST", raising=False)
    monkeypatch.delenv("DPLAB_DATA_SOURCE", raising=False)
    monkeypatch.setattr(fm, "SYSTEM_DIRS", [tmp_path / "usr-share"])
    monkeypatch.setattr(fm, "_announced", set())  # each test sees its own announcements
    return tmp_path


def test_asking_for_the_full_set_lists_what_was_tried(nowhere):
    with pytest.raises(fm.DataNotFound) as error:
        fm.fashion_mnist(source="full")
    message = str(error.value)
    assert "torchvision's folder" in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert "DPLAB_OFFLINE" in message


def test_with_nothing_installed_auto_falls_back_to_the_sample(nowhere, capsys):
    assert fm.fashion_mnist().is_sample
    assert "embedded sample" in capsys.readouterr().out


def sample_copy(folder, compress: bool):
    """Write the sample's four files into `folder`, gzipped or not, as a stand-in full set."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in fm.FILES.values():
        source = fm.SAMPLE_DIR / f"{name}.gz"
        if compress:
            shutil.copy(source, folder / f"{name}.gz")
        else:
            (folder / name).write_bytes(gzip.decompress(source.read_bytes()))


def test_a_folder_given_by_the_user_comes_first(nowhere, capsys):
    sample_copy(nowhere / "mine", compress=False)
    data = fm.fashion_mnist(path=nowhere / "mine", source="full")
    assert not data.is_sample and len(data.train_images) == 4000
    assert "the folder you gave" in capsys.readouterr().out


def test_the_torchvision_folder_is_found(nowhere):
    sample_copy(nowhere / "root" / "FashionMNIST" / "raw", compress=True)
    assert "torchvision's folder" in fm.fashion_mnist(source="full").source


def test_the_debian_package_folder_is_found(nowhere):
    sample_copy(nowhere / "usr-share", compress=True)
    assert "dataset-fashion-mnist package" in fm.fashion_mnist(source="full").source


def test_a_damaged_file_is_reported(tmp_path):
    bad = tmp_path / "train-images-idx3-ubyte"
    bad.write_bytes(bytes([0, 0, 8, 3]) + struct.pack(">3I", 10, 28, 28) + b"\x00" * 50)
    with pytest.raises(ValueError, match="truncated"):
        fm.read_idx(bad)


def test_the_books_dataloader_pipeline_reads_the_same_images(nowhere):
    train_iter, test_iter = dplab.load_data_fashion_mnist_book(100, source="sample", num_workers=0)
    ours, _ = dplab.load_data_fashion_mnist(100, source="sample")
    assert len(train_iter.dataset) == 4000 and len(test_iter.dataset) == 1000
    X, _ = next(iter(test_iter))
    mine = next(iter(dplab.load_data_fashion_mnist(100, source="sample")[1]))[0]
    assert torch.allclose(X, mine)
    assert len(ours) == len(train_iter)


@pytest.mark.skipif(not FULL_SET_INSTALLED, reason="dataset-fashion-mnist is not installed")
def test_the_installed_full_set_has_60000_and_10000_images():
    data = fm.fashion_mnist(source="full")
    assert (len(data.train_images), len(data.test_images)) == (60000, 10000)
    assert torch.bincount(data.test_labels).tolist() == [1000] * 10


def test_a_notebooks_definitions_load_without_its_training_runs_or_launches(tmp_path):
    """What `torchrun -m dplab.train_ddp` reads of a notebook: its definitions, in the book's
    `d2l` spelling, never a training run it skips or a launch, however deep."""
    from dplab.notebook import definitions
    from tests.conftest import write_notebook

    ran = tmp_path / "ran"
    notebook = write_notebook(
        tmp_path / "distributed.ipynb",
        "%matplotlib inline\nfrom d2l import torch as d2l",
        f"def train_ddp(*args):\n    open({str(ran)!r}, 'w').close()",
        "def demo():\n    return d2l.launch(train_ddp, nprocs=2)",
        "train_ddp(10, 256)",
        "result = demo()",
        "defined = d2l.try_all_gpus is not None",
    )
    found = definitions(notebook, skip_calls=frozenset({"train_ddp"}))
    assert callable(found["train_ddp"]) and found["defined"] is True
    assert "result" not in found  # its statement ended at the launch
    assert not ran.exists()


def test_an_animator_over_one_epoch_warns_of_nothing(tmp_path, monkeypatch):
    """`xlim=[1, num_epochs]` with one epoch (the notebooks' short run on stand-in devices)
    plots without matplotlib's warning about identical limits."""
    monkeypatch.setenv("DPLAB_FIGURE_DIR", str(tmp_path))
    animator = dplab.plot.Animator("epoch", "test acc", xlim=[1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        animator.add(1, (0.5,))

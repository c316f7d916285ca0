"""Known wrong versions of the from-scratch `train` loop: the book's with one part changed."""

from grader.exercises.catalogue import Mistake, variant

BOOK = """
def train(num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    device_params = [get_params(params, d) for d in devices]
    animator = d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    timer = d2l.Timer()
<<LOOP>>
<<SUMMARY>>
    return animator.Y[0]
"""
RIGHT = {
    "LOOP": """    for epoch in range(num_epochs):
        timer.start()
        for X, y in train_iter:
            <<STEP>>
            <<SYNC>>
        timer.stop()
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(
            <<EVALUATED>>, test_iter, devices[0]),))""",
    "STEP": "train_batch(X, y, device_params, devices, lr)",
    "EVALUATED": "lambda x: lenet(x, device_params[0])",
    "SYNC": "torch.cuda.synchronize()",  # the book's; it runs on stand-ins too
    "SUMMARY": "    print(f'test acc: {animator.Y[0][-1]:.2f}, {timer.avg():.1f} sec/epoch on "
    "{str(devices)}')",
}

swapped_loops = Mistake(
    source=variant(
        BOOK,
        RIGHT,
        LOOP="""    for X, y in train_iter:
        for epoch in range(num_epochs):
            timer.start()
            train_batch(X, y, device_params, devices, lr)
            timer.stop()
    for epoch in range(num_epochs):
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(
            lambda x: lenet(x, device_params[0]), test_iter, devices[0]),))""",
    ),
    fails="visits_every_batch_once_per_epoch",
    hint_mentions="loops are swapped",
    seen_in="seed notes: for epoch and for X, y written the wrong way round",
)

evaluates_before_the_epoch = Mistake(
    source=variant(
        BOOK,
        RIGHT,
        LOOP="""    for epoch in range(num_epochs):
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(
            lambda x: lenet(x, device_params[0]), test_iter, devices[0]),))
        timer.start()
        for X, y in train_iter:
            train_batch(X, y, device_params, devices, lr)
        timer.stop()""",
    ),
    fails="evaluates_a_trained_replica_after_each_epoch",
    hint_mentions="After each epoch's minibatches",
    seen_in="evaluation at the top of the epoch: the accuracy of epoch 1 is the untrained "
    "model's, and the last epoch's training is never measured",
)

evaluates_the_initial_parameters = Mistake(
    source=variant(
        BOOK,
        RIGHT,
        EVALUATED="lambda x: lenet(x, [p.to(devices[0]) for p in params])",
    ),
    fails="evaluates_a_trained_replica_after_each_epoch",
    hint_mentions="evaluate a replica being trained",
    seen_in="params (the weights before training) evaluated in place of device_params[0]: "
    "the accuracy stays at chance while the replicas learn",
)

trains_on_one_device = Mistake(
    source=variant(
        BOOK,
        RIGHT,
        STEP="train_batch(X, y, device_params[:1], devices[:1], lr)",
    ),
    fails="every_step_uses_every_devices_replica",
    hint_mentions="hand train_batch all of them",
    seen_in="a loop that learns, and scores the same accuracy, while the other devices idle",
)

no_summary_line = Mistake(
    source=variant(BOOK, RIGHT, SUMMARY="    print('测试精度：', animator.Y[0][-1])"),
    fails="prints_the_summary_line",
    hint_mentions="sec/epoch on",
)

restarts_from_the_initial_weights_each_epoch = Mistake(
    source=variant(BOOK, RIGHT).replace(
        "        timer.start()\n",
        "        timer.start()\n        device_params = [get_params(params, d) for d in devices]\n",
    ),
    fails="accuracy_rises_above_chance",
    hint_mentions="keep training the same weights from one epoch to the next",
    seen_in="the copies made inside the epoch loop, from params: each epoch starts afresh",
)

"""Known wrong versions of the concise `train`."""

from grader.exercises.catalogue import Mistake, variant

BOOK = """
def train(net, num_gpus, batch_size, lr, num_epochs=10, data=None, devices=None):
    train_iter, test_iter = data if data is not None else d2l.load_data_fashion_mnist(batch_size)
    devices = devices if devices is not None else [d2l.try_gpu(i) for i in range(num_gpus)]
    def init_weights(m):
        if type(m) in [nn.Linear, nn.Conv2d]:
            nn.init.normal_(m.weight, std=0.01)
    <<INIT>>
    net = nn.DataParallel(<<MOVED>>, device_ids=<<DEVICE_IDS>>)
    trainer = torch.optim.SGD(net.parameters(), lr)
    loss = nn.CrossEntropyLoss()
    timer, animator = d2l.Timer(), d2l.Animator('epoch', 'test acc', xlim=[1, num_epochs])
    <<TRAIN_ONCE>>
    for epoch in range(num_epochs):
        <<TRAIN_EACH>>
        timer.start()
        for X, y in train_iter:
            <<ZERO>>
            X, y = X.to(devices[0]), y.to(devices[0])
            l = loss(<<FORWARD>>, y)
            l.backward()
            trainer.step()
        timer.stop()
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(net, test_iter),))
    print(f'test acc: {animator.Y[0][-1]:.2f}, {timer.avg():.1f} sec/epoch on {str(devices)}')
    <<RETURN>>
"""
RIGHT = {
    "INIT": "net.apply(init_weights)",
    "MOVED": "net.to(devices[0])",
    "DEVICE_IDS": "devices",
    "TRAIN_ONCE": "pass",
    "TRAIN_EACH": "net.train()",
    "ZERO": "trainer.zero_grad()",
    "FORWARD": "net(X)",
    "RETURN": "return animator.Y[0]",
}


no_initialisation = Mistake(
    source=variant(BOOK, RIGHT, INIT="pass"),
    fails="initialises_weights_with_std_0_01",
    hint_mentions="nn.init.normal_(m.weight, std=0.01)",
)

train_mode_set_once = Mistake(
    source=variant(BOOK, RIGHT, TRAIN_ONCE="net.train()", TRAIN_EACH="pass"),
    fails="trains_in_train_mode_and_evaluates_in_eval_mode",
    hint_mentions="call net.train() at the start of every epoch",
)

gradients_never_zeroed = Mistake(
    source=variant(BOOK, RIGHT, ZERO="pass"),
    fails="training_matches_plain_sgd",
    hint_mentions="zero the gradients before each backward",
)

hard_coded_device_ids = Mistake(
    source=variant(BOOK, RIGHT, DEVICE_IDS="[0, 1]"),
    fails="wraps_the_net_in_data_parallel_on_the_given_devices",
    hint_mentions="device_ids=devices",
    seen_in="devices 0 and 1 written in, which holds only while those are the devices given",
)

forward_through_the_inner_network = Mistake(
    source=variant(BOOK, RIGHT, FORWARD="net.module(X)"),
    fails="every_minibatch_is_split_across_the_devices",
    hint_mentions="through the nn.DataParallel wrapper",
    seen_in="a loop that learns while nn.DataParallel is bypassed and one device works",
)

net_not_on_the_first_device = Mistake(
    source=variant(BOOK, RIGHT, MOVED="net"),
    fails="moves_the_net_to_the_first_device",
    hint_mentions="net.to(devices[0])",
    seen_in="the book's concise code, which leaves this step out",
)

returns_nothing = Mistake(
    source=variant(BOOK, RIGHT, RETURN="pass"),
    fails="returns_the_accuracy_history",
    hint_mentions="Return the test accuracies, one per epoch",
    seen_in="the book's concise code of both editions, which only prints the last accuracy",
)

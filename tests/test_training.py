"""A whole network through training (clconv/apps/digits.py) against PyTorch step by step, and
weights moved between PyTorch models and clconv.nn modules."""
import numpy as np
import pyopencl.array as cla
import pytest

import clconv
from clconv.apps import digits
from helpers import assert_close

torch = pytest.importorskip("torch", reason="PyTorch (the `bench` extra, which `make test` installs) is absent")
pytest.importorskip("sklearn", reason="scikit-learn (the `examples` extra, which `make test` installs) is absent")


def _torch_net(net):
    """The same network in PyTorch, float64, with the clconv network's current weights."""
    layers = torch.nn.ModuleList(
        torch.nn.Conv2d(c.in_channels, c.out_channels, c.kernel_size, c.stride, c.padding, c.dilation, c.groups,
                        bias=c.bias is not None, dtype=torch.float64) for c in net.layers)
    clconv.nn.to_torch({str(i): c for i, c in enumerate(net.layers)}, layers)
    return layers


def _torch_forward(layers, x):
    for i, layer in enumerate(layers):
        x = layer(x)
        if i < len(layers) - 1:
            x = torch.relu(x)
    return x.reshape(x.shape[0], -1)


def test_training_steps_match_pytorch(queue):
    """Five SGD steps with momentum on the same batches: every step's loss and, after them,
    every weight and bias agree with PyTorch's float64 run within the float32 tolerance."""
    xtr, ytr, _, _ = digits.load()
    net = digits.DigitsNet(queue, seed=3)
    layers = _torch_net(net)
    opt = torch.optim.SGD(layers.parameters(), lr=0.05, momentum=0.9)
    images, labels = cla.to_device(queue, xtr), cla.to_device(queue, ytr)
    order = np.random.default_rng(1).permutation(len(ytr)).astype(np.int32)
    for step in range(5):
        rows = order[step * 32:(step + 1) * 32]
        x, y = digits.batch(queue, images, labels, cla.to_device(queue, rows))
        loss = net.step(x, y, 0.05, 0.9).get()[0] / len(rows)
        opt.zero_grad()
        want = torch.nn.functional.cross_entropy(_torch_forward(layers, torch.from_numpy(xtr[rows]).double()),
                                                 torch.from_numpy(ytr[rows]).long())
        want.backward()
        opt.step()
        assert_close([loss], [want.item()], np.float32, f"loss of step {step}")
    for i, (conv, layer) in enumerate(zip(net.layers, layers)):
        assert_close(conv.weight.get(), layer.weight.detach().numpy(), np.float32, f"layer {i} weight")
        assert_close(conv.bias.get(), layer.bias.detach().numpy(), np.float32, f"layer {i} bias")


@pytest.mark.whole_program
def test_a_few_epochs_learn_the_digits(queue):
    history = digits.train(epochs=3, queue=queue, progress=False)
    assert history["loss"][-1] < history["loss"][0] and history["accuracy"][-1] > 0.85, history


def test_torch_conv_weights_round_trip(queue):
    """from_torch copies every Conv2d of a model (options and weights), nested ones too, so
    clconv computes the model's convolutions; to_torch copies changed weights back."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.Sequential(torch.nn.Conv2d(8, 8, (3, 2), padding=(1, 0), groups=4, bias=False),
                            torch.nn.Conv2d(8, 6, 1, dilation=2))).double()
    convs = clconv.nn.from_torch(model, queue=queue, dtype=np.float32)
    assert list(convs) == ["0", "2.0", "2.1"] and convs["2.0"].bias is None and convs["2.0"].groups == 4
    x = np.random.default_rng(0).standard_normal((2, 3, 11, 9))
    y = convs["0"].forward(x.astype(np.float32))
    with torch.no_grad():
        want = model[0](torch.from_numpy(x))
    assert_close(y.get(), want.numpy(), np.float32, "first layer")
    for conv in convs.values():
        conv.weight *= 2
    clconv.nn.to_torch(convs, model)
    for name, conv in convs.items():
        assert_close(dict(model.named_modules())[name].weight.detach().numpy(), conv.weight.get(), np.float32, name)
    with pytest.raises(ValueError, match="has no Conv2d named 'missing'"):
        clconv.nn.to_torch({"missing": convs["0"]}, model)

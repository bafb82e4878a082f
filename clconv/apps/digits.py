"""Train a small all-convolutional network on scikit-learn's handwritten digits, on the
OpenCL device from start to finish: ``python -m clconv train-digits``.

The 1,797 8x8 images ship inside scikit-learn (no download); a fixed 80/20 split. The
network is made of :class:`clconv.nn.Conv2d` modules only, one of each kind users meet:

  conv1   3x3, 1 -> 16 channels, padding 1, ReLU              8x8
  conv2   3x3, stride 2, 2 groups, 16 -> 32, ReLU              4x4  (strided, grouped)
  dw      3x3 depthwise, 32 channels, padding 1, ReLU          4x4
  pw      1x1, 32 -> 64, ReLU                                  4x4  (pointwise)
  fc      4x4 over the whole 4x4 input, 64 -> 10 logits        1x1  (fully-connected mode)

Every ReLU is fused into its convolution's forward (bias and ReLU as the output is written).
Softmax cross-entropy, its gradient, the accuracy count, their sums and SGD with momentum run
as OpenCL kernels through pyopencl's elementwise tools; the host reads back only the loss and
accuracy it prints (one number each per epoch). Built on clconv's public API only.
"""
import time

import numpy as np
import pyopencl.array as cla
from pyopencl.elementwise import ElementwiseKernel
from pyopencl.tools import context_dependent_memoize

import clconv
from clconv import default_queue, nn
from clconv.mpi import DataParallel

CLASSES = 10
SIDE = 8


def load(seed=0):
    """(train images, train labels, test images, test labels): float32 (n, 1, 8, 8) in [0, 1],
    int32 labels; a fixed 80/20 split of the shuffled 1,797 images."""
    from sklearn.datasets import load_digits   # the `examples` extra
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(labels))
    cut = int(0.8 * len(labels))
    train, test = order[:cut], order[cut:]
    return images[train], labels[train], images[test], labels[test]


class DigitsNet:
    """The network above; ``layers`` in order, each a :class:`clconv.nn.Conv2d`."""

    def __init__(self, queue=None, seed=0):
        self.queue = queue or default_queue()
        opts = dict(dtype=np.float32, queue=self.queue)   # (the loss and SGD kernels are float32)
        self.layers = [
            nn.Conv2d(1, 16, 3, padding=1, relu=True, seed=seed, **opts),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=2, relu=True, seed=seed + 1, **opts),
            nn.Conv2d(32, 32, 3, padding=1, groups=32, relu=True, seed=seed + 2, **opts),
            nn.Conv2d(32, 64, 1, relu=True, seed=seed + 3, **opts),
            nn.Conv2d(64, CLASSES, SIDE // 2, seed=seed + 4, **opts),
        ]
        self._inputs = []
        self._velocity = [[cla.zeros_like(p) for p in layer.parameters()] for layer in self.layers]

    def forward(self, x):
        """Logits (N, 10, 1, 1) of images x (N, 1, 8, 8); keeps each layer's input for backward."""
        self._inputs = []
        for layer in self.layers:
            self._inputs.append(x)
            x = layer.forward(x)
        return x

    def backward(self, grad_logits, ready=None):
        """Gradients of every layer's weight and bias (set, not added) from the logits' gradient;
        ``ready(layer)`` after each layer's (a :meth:`clconv.mpi.DataParallel.ready`)."""
        g = grad_logits
        for layer, x in zip(reversed(self.layers), reversed(self._inputs)):
            layer.zero_grad()
            g = layer.backward(x, g)
            if ready:
                ready(layer)

    def sgd(self, lr, momentum):
        """v = momentum * v + grad; p -= lr * v (PyTorch's SGD with momentum, no dampening)."""
        update = _kernels(self.queue.context)["sgd"]
        for layer, velocity in zip(self.layers, self._velocity):
            grads = [layer.grad_weight] + ([layer.grad_bias] if layer.bias is not None else [])
            for p, g, v in zip(layer.parameters(), grads, velocity):
                update(p, g, v, np.float32(lr), np.float32(momentum), queue=self.queue)

    def step(self, x, labels, lr, momentum, dp=None):
        """One SGD step on images x and labels (device arrays); returns the batch's summed loss
        as a device scalar (not read back). With ``dp`` (a :class:`clconv.mpi.DataParallel`),
        x is this rank's share of the batch (perhaps none) and the gradients are averaged over
        every rank's images before the update."""
        n = labels.shape[0]
        if dp is not None:
            dp.start(n)
        if n:
            loss, grad = cross_entropy(self.forward(x), labels)
            self.backward(grad, dp.ready if dp is not None else None)
        else:   # no image here: this rank adds zeros to the others' sums
            loss = cla.zeros(self.queue, (1,), np.float32)
            for layer in reversed(self.layers):
                layer.zero_grad()
                dp.ready(layer)
        if dp is not None:
            dp.finish()
        self.sgd(lr, momentum)
        return loss

    def correct(self, x, labels):
        """How many of the images x the network classifies right, as a device scalar."""
        logits = self.forward(x)
        hits = _empty(self.queue, labels.shape, np.float32)
        _kernels(self.queue.context)["argmax_hits"](hits, logits, labels, np.int32(CLASSES), queue=self.queue)
        return _sum(hits)


@context_dependent_memoize
def _kernels(context):
    return {
        # per image n: loss[n] = logsumexp(z[n]) - z[n, label]; grad[n] = (softmax(z[n]) - onehot) * scale
        "xent": ElementwiseKernel(
            context,
            "float *loss, const float *z, const int *labels, float *grad, const int C, const float scale",
            """
            __global const float *zi = z + i * C;
            float top = zi[0];
            for (int c = 1; c < C; ++c) top = zi[c] > top ? zi[c] : top;
            float total = 0;
            for (int c = 0; c < C; ++c) total += exp(zi[c] - top);
            const int y = labels[i];
            loss[i] = log(total) + top - zi[y];
            for (int c = 0; c < C; ++c)
                grad[i * C + c] = (exp(zi[c] - top) / total - (c == y ? 1.0f : 0.0f)) * scale;
            """, "clconv_digits_xent"),
        "argmax_hits": ElementwiseKernel(
            context, "float *hits, const float *z, const int *labels, const int C",
            """
            __global const float *zi = z + i * C;
            int best = 0;
            for (int c = 1; c < C; ++c) if (zi[c] > zi[best]) best = c;
            hits[i] = best == labels[i] ? 1.0f : 0.0f;
            """, "clconv_digits_hits"),
        "sgd": ElementwiseKernel(
            context, "float *p, const float *g, float *v, const float lr, const float momentum",
            "v[i] = momentum * v[i] + g[i]; p[i] -= lr * v[i]", "clconv_digits_sgd"),
        # out[i] = src[rows[i / width] * width + i % width]: a batch of rows gathered on the device
        # (an elementwise kernel runs over its first array: here the output)
        "gather": ElementwiseKernel(
            context, "float *out, const float *src, const int *rows, const int width",
            "out[i] = src[rows[i / width] * width + i % width]", "clconv_digits_gather"),
        # out[0] = the sum of x[0 ... count-1], in order, by one work-item (a batch, or the test set)
        "sum": ElementwiseKernel(
            context, "float *out, const float *x, const int count",
            "float s = 0; for (int j = 0; j < count; ++j) s += x[j]; out[i] = s", "clconv_digits_sum"),
        "gather_labels": ElementwiseKernel(
            context, "int *out, const int *src, const int *rows", "out[i] = src[rows[i]]", "clconv_digits_labels"),
    }


def cross_entropy(logits, labels):
    """(summed loss as a device scalar, gradient of the mean loss w.r.t. the logits) for logits
    (N, 10, 1, 1) and int32 labels (N,)."""
    queue = logits.queue
    n = labels.shape[0]
    loss = _empty(queue, (n,), np.float32)
    grad = _empty(queue, logits.shape, np.float32)
    _kernels(queue.context)["xent"](loss, logits, labels, grad, np.int32(CLASSES), np.float32(1.0 / n), queue=queue)
    return _sum(loss), grad


def _empty(queue, shape, dtype):
    """A new array from clconv's memory pool of the queue, as clconv's own results are (no buffer per step)."""
    return cla.empty(queue, tuple(shape), dtype, allocator=clconv.memory_pool(queue))


def shares(total, ranks):
    """``total`` images cut into ``ranks`` shares as even as can be, the first ranks taking one more."""
    each, more = divmod(total, ranks)
    return [each + (r < more) for r in range(ranks)]


def _sum(x):
    """The sum of the float32 device vector ``x`` as a device scalar."""
    out = _empty(x.queue, (1,), np.float32)
    _kernels(x.queue.context)["sum"](out, x, np.int32(x.size), queue=x.queue)
    return out


def batch(queue, images, labels, rows):
    """Images (len(rows), 1, 8, 8) and labels of ``rows`` (a device int32 array), gathered on the device."""
    k = _kernels(queue.context)
    x = _empty(queue, (rows.shape[0],) + images.shape[1:], np.float32)
    y = _empty(queue, rows.shape, np.int32)
    k["gather"](x, images, rows, np.int32(int(np.prod(images.shape[1:]))), queue=queue)
    k["gather_labels"](y, labels, rows, queue=queue)
    return x, y


def train(epochs=30, batch_size=32, lr=0.05, momentum=0.9, seed=0, queue=None, plot=None, progress=True, comm=None,
          overlap="auto"):
    """Train on the 80 % split and test on the rest after every epoch. Returns
    {"loss": [mean training loss per epoch], "accuracy": [test accuracy per epoch], "seconds"}.

    ``comm``: an MPI communicator of more than one rank (``mpiexec -n 2``): each rank takes its
    share of every batch (the same batches as one process) and :class:`clconv.mpi.DataParallel`
    averages the gradients over the ranks (``overlap``: each layer's reduction during the
    earlier layers' backward); rank 0 reports and plots."""
    from tqdm import tqdm
    queue = queue or default_queue()
    xtr, ytr, xte, yte = load(seed)
    images, labels = cla.to_device(queue, xtr), cla.to_device(queue, ytr)
    test_x, test_y = cla.to_device(queue, xte), cla.to_device(queue, yte)
    net = DigitsNet(queue, seed=seed)
    dp = None
    if comm is not None and comm.Get_size() > 1:
        dp = DataParallel(net.layers, comm, overlap)
        progress = progress and dp.rank == 0
    rng = np.random.default_rng(seed)
    history = {"loss": [], "accuracy": []}
    start = time.perf_counter()
    for epoch in range(epochs):
        order = cla.to_device(queue, rng.permutation(len(ytr)).astype(np.int32))   # this epoch's batches
        total = cla.zeros(queue, (1,), np.float32)
        starts = range(0, len(ytr), batch_size)
        for b0 in tqdm(starts, desc=f"epoch {epoch + 1}/{epochs}", unit="batch", disable=not progress, leave=False):
            b1 = min(b0 + batch_size, len(ytr))
            if dp is not None:   # this rank's share of the batch, as even as the ranks allow
                cut = np.cumsum([0] + shares(b1 - b0, dp.size))
                b0, b1 = b0 + int(cut[dp.rank]), b0 + int(cut[dp.rank + 1])
            x, y = batch(queue, images, labels, order[b0:b1])
            total += net.step(x, y, lr, momentum, dp)
        loss = float(total.get()[0])
        history["loss"].append((dp.comm.allreduce(loss) if dp is not None else loss) / len(ytr))
        history["accuracy"].append(float(net.correct(test_x, test_y).get()[0]) / len(yte))
        if progress:
            tqdm.write(f"epoch {epoch + 1:3d}: training loss {history['loss'][-1]:.4f}, "
                       f"test accuracy {history['accuracy'][-1]:.4f}")
    history["seconds"] = time.perf_counter() - start
    if plot and (dp is None or dp.rank == 0):
        draw(history, plot, queue.device)
    return history


def draw(history, path, device):
    """A PNG of the training loss and the test accuracy per epoch (matplotlib, the `plot` extra)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    epochs = range(1, len(history["loss"]) + 1)
    fig, loss_axis = plt.subplots(figsize=(6, 3.5))
    loss_axis.plot(epochs, history["loss"], color="tab:blue")
    loss_axis.set_xlabel("epoch")
    loss_axis.set_ylabel("training loss", color="tab:blue")
    accuracy_axis = loss_axis.twinx()
    accuracy_axis.plot(epochs, history["accuracy"], color="tab:red")
    accuracy_axis.set_ylabel("test accuracy", color="tab:red")
    fig.suptitle(f"clconv, digits: {history['accuracy'][-1]:.1%} test accuracy in {history['seconds']:.0f} s "
                 f"on {device.name.strip()}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


"""Bad input: each case raises ValueError/TypeError naming the sizes, and leaves ``out`` bit-identical."""
import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pytest

import clconv

X, W = (2, 4, 7, 6), (6, 2, 3, 3)   # groups=2 -> output (2, 6, 5, 4)
Y = (2, 6, 5, 4)


def arr(queue, shape, dtype=np.float32):
    return cla.to_device(queue, np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape) % 7)


fwd = clconv.conv2d


def replayed(e, **options):
    """e's plain call three times, so that the next call of its layout takes the replayed path
    (its checks there are the quick ones of clconv.replay.replay_layout)."""
    for _ in range(3):
        fwd(e.x, e.w, groups=2, **options)
    return e


# (id, call(e, out) with e the Env below, expected exception, text the message must hold)
BAD_CASES = [
    ("input_rank", lambda e, out: fwd(arr(e.queue, (4, 7, 6)), e.w, groups=2, out=out), ValueError, "[4, 7, 6]"),
    ("weight_rank", lambda e, out: fwd(e.x, arr(e.queue, (6, 2, 3)), groups=2, out=out), ValueError, "[6, 2, 3]"),
    ("dtype_mismatch", lambda e, out: fwd(e.x, arr(e.queue, W, np.float64), groups=2, out=out), TypeError, "float64"),
    ("integer_input", lambda e, out: fwd(arr(e.queue, X, np.int32), e.w, groups=2, out=out), TypeError, "int32"),
    ("integer_numpy", lambda e, out: fwd(np.ones(X, np.int64), e.w.get(), groups=2), TypeError, "int64"),
    ("channels_not_divisible", lambda e, out: fwd(arr(e.queue, (2, 5, 7, 6)), e.w, groups=2, out=out), ValueError,
     "[2, 5, 7, 6]"),
    ("weight_channels_mismatch", lambda e, out: fwd(e.x, arr(e.queue, (6, 3, 3, 3)), groups=2, out=out), ValueError,
     "[6, 3, 3, 3]"),
    ("k_not_divisible", lambda e, out: fwd(e.x, arr(e.queue, (5, 2, 3, 3)), groups=2, out=out), ValueError,
     "[5, 2, 3, 3]"),
    ("groups_zero", lambda e, out: fwd(e.x, e.w, groups=0, out=out), ValueError, "groups"),
    ("groups_negative", lambda e, out: fwd(e.x, e.w, groups=-2, out=out), ValueError, "groups"),
    ("stride_zero", lambda e, out: fwd(e.x, e.w, stride=0, groups=2, out=out), ValueError, "stride"),
    ("stride_negative", lambda e, out: fwd(e.x, e.w, stride=(1, -1), groups=2, out=out), ValueError, "stride"),
    ("dilation_zero", lambda e, out: fwd(e.x, e.w, dilation=0, groups=2, out=out), ValueError, "dilation"),
    ("padding_negative", lambda e, out: fwd(e.x, e.w, padding=-1, groups=2, out=out), ValueError, "padding"),
    ("padding_unknown_string", lambda e, out: fwd(e.x, e.w, padding="full", groups=2, out=out), ValueError, "full"),
    ("padding_bad_type", lambda e, out: fwd(e.x, e.w, padding=1.5, groups=2, out=out), TypeError, "1.5"),
    ("kernel_larger_than_input", lambda e, out: fwd(e.x, arr(e.queue, (6, 2, 8, 3)), groups=2, out=out), ValueError,
     "[6, 2, 8, 3]"),
    ("bias_wrong_length", lambda e, out: fwd(e.x, e.w, arr(e.queue, (5,)), groups=2, out=out), ValueError, "[5]"),
    ("bias_wrong_rank", lambda e, out: fwd(e.x, e.w, arr(e.queue, (6, 1)), groups=2, out=out), ValueError, "[6, 1]"),
    ("out_wrong_shape", lambda e, out: fwd(e.x, e.w, groups=2, out=arr(e.queue, (2, 6, 5, 5))), ValueError,
     "[2, 6, 5, 5]"),
    ("out_wrong_dtype", lambda e, out: fwd(e.x, e.w, groups=2, out=arr(e.queue, Y, np.float64)), TypeError, "float64"),
    ("out_other_context", lambda e, out: fwd(e.x, e.w, groups=2, out=arr(e.oq, Y)), ValueError, "context"),
    ("arrays_other_contexts", lambda e, out: fwd(e.x, arr(e.oq, W), groups=2, out=out), ValueError, "context"),
    ("non_contiguous", lambda e, out: fwd(arr(e.queue, (2, 4, 6, 7)).transpose((0, 1, 3, 2)), e.w, groups=2, out=out),
     ValueError, "contiguous"),
    ("misaligned_input", lambda e, out: fwd(cla.Array(e.queue, X, np.float32, data=e.big.base_data, offset=2), e.w,
                                            groups=2, out=out), ValueError, "byte offset 2"),
    ("out_overlaps_input", lambda e, out: fwd(e.big[:336].reshape(X), e.w, groups=2, out=e.big[100:340].reshape(Y)),
     ValueError, "overlaps"),
    ("zero_channels", lambda e, out: fwd(np.ones((2, 0, 7, 6), np.float32), np.ones((6, 0, 3, 3), np.float32)),
     ValueError, "[2, 0, 7, 6]"),
    ("zero_height", lambda e, out: fwd(np.ones((2, 4, 0, 6), np.float32), e.w.get(), groups=2), ValueError,
     "[2, 4, 0, 6]"),
    ("grad_output_wrong_size", lambda e, out: clconv.conv2d_input(X, e.w, arr(e.queue, (2, 6, 4, 4)), groups=2, out=out),
     ValueError, "[2, 6, 4, 4]"),
    ("grad_weight_wrong_grad_output", lambda e, out: clconv.conv2d_weight(e.x, W, arr(e.queue, (2, 6, 5)), groups=2),
     ValueError, "[2, 6, 5]"),
    ("grad_bias_rank", lambda e, out: clconv.conv2d_bias(arr(e.queue, (2, 6, 5))), ValueError, "[2, 6, 5]"),
    ("not_an_array", lambda e, out: fwd([[1.0]], e.w, out=out), TypeError, "list"),
    ("plan_input_none", lambda e, out: clconv.plan(X, W, groups=2, queue=e.queue).forward(None, e.w, out=out),
     TypeError, "input must be"),
    ("plan_weight_none", lambda e, out: clconv.plan(X, W, groups=2, queue=e.queue).backward_input(None, e.dy),
     TypeError, "weight must be"),
    ("out_not_an_array", lambda e, out: fwd(e.x, e.w, groups=2, out=[0.0]), TypeError, "out must be"),
    ("stride_bool_after_the_int", lambda e, out: fwd(replayed(e, stride=1).x, e.w, stride=True, groups=2, out=out),
     TypeError, "True"),
    # pairs of ints key the functional API's plan as they are: a pair equal to them is not
    ("stride_pair_of_bool_after_ints", lambda e, out: fwd(replayed(e, stride=(1, 1)).x, e.w, stride=(True, 1),
                                                          groups=2, out=out), TypeError, "True"),
    ("padding_pair_of_float_after_ints", lambda e, out: fwd(replayed(e, padding=(1, 1)).x, e.w, padding=(1.0, 1),
                                                            groups=2, out=out), TypeError, "1.0"),
    ("non_contiguous_after_replays", lambda e, out: fwd(arr(replayed(e).queue, (2, 4, 6, 7)).transpose((0, 1, 3, 2)),
                                                        e.w, groups=2), ValueError, "contiguous"),
    ("dtype_mismatch_after_replays", lambda e, out: fwd(replayed(e).x, arr(e.queue, W, np.float64), groups=2),
     TypeError, "float64"),
    ("unknown_algorithm", lambda e, out: clconv.plan(X, W, groups=2, algorithm="cudnn"), ValueError, "cudnn"),
]


class Env:
    def __init__(self, queue):
        self.queue = queue
        self.x, self.w, self.dy = arr(queue, X), arr(queue, W), arr(queue, Y)
        self.other = cl.Context([queue.device])   # kept: some runtimes release a context without a reference
        self.oq = cl.CommandQueue(self.other)
        self.big = cla.zeros(queue, 2000, np.float32)


@pytest.mark.parametrize("call,exc,text", [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_input_raises_and_leaves_out_untouched(queue, call, exc, text):
    out = cla.empty(queue, Y, np.float32)
    out.fill(np.float32(-3.25))
    with pytest.raises(exc) as info:
        call(Env(queue), out)
    assert text in str(info.value), f"message {info.value!s} does not name {text!r}"
    np.testing.assert_array_equal(out.get(), np.full(Y, -3.25, np.float32))


def test_float64_without_fp64_is_refused(queue, monkeypatch):
    from clconv import device
    monkeypatch.setattr(device, "has_fp64", lambda dev: False)
    with pytest.raises(TypeError, match="cl_khr_fp64"):
        clconv.conv2d(np.ones(X), np.ones(W), groups=2)


def test_unsupported_float_dtype_is_refused(queue):
    with pytest.raises(TypeError, match="float16, float32 and float64"):
        clconv.conv2d(np.ones(X, np.longdouble), np.ones(W, np.longdouble), groups=2)


def test_out_of_order_queue_is_refused(queue):
    props = cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    if not queue.device.queue_properties & props:
        pytest.skip("device has no out-of-order queues")
    ooo = cl.CommandQueue(queue.context, properties=props)
    with pytest.raises(ValueError, match="in-order"):
        clconv.conv2d(arr(ooo, X), arr(ooo, W), groups=2)

"""What every algorithm shares: buffer references and index-type choice."""
from collections import namedtuple

import numpy as np

from ..programs import index_type

Ref = namedtuple("Ref", "buf off")
Ref.__doc__ = "A raw OpenCL buffer and an element offset into it."


def ref(array):
    """The (buffer, element offset) of a contiguous pyopencl Array."""
    return Ref(array.base_data, array.offset // array.dtype.itemsize)


def idx_for(dtype, *refs):
    """Kernel index type able to address every element of every referenced buffer."""
    itemsize = np.dtype(dtype).itemsize
    return index_type(*(r.buf.size // itemsize for r in refs if r is not None))


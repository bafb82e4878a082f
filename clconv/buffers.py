"""Buffer references: what every pass hands its kernels and GEMMs instead of arrays."""
from collections import namedtuple

import numpy as np

from .programs import index_type

Ref = namedtuple("Ref", "buf off end", defaults=(None,))
Ref.__doc__ = ("A raw OpenCL buffer, an element offset into it and, where known, the element just past "
               "the data the kernels may touch (else the buffer's end).")


def ref(array):
    """The (buffer, element offset, end) of a contiguous pyopencl Array."""
    off = array.offset // array.dtype.itemsize
    return Ref(array.base_data, off, off + array.size)


def idx_for(dtype, *refs):
    """Kernel index type able to address every element the references reach."""
    itemsize = np.dtype(dtype).itemsize
    return index_type(*(r.buf.size // itemsize if r.end is None else r.end for r in refs if r is not None))

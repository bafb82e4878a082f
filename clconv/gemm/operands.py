"""What a grid of GEMMs is given: its :class:`Grid`, an :class:`Operand` for each of A, B and C,
and its :class:`Epilogue`; every engine's ``grid_gemm`` takes these."""
from typing import NamedTuple, Optional


class Operand(NamedTuple):
    """One matrix operand of a grid of GEMMs: its buffer, the element offset of its first
    matrix, its leading dimension, the elements from one matrix to the next along the grid's
    group and image axes (0: the same matrix for all) and from one K block to the next
    (``k_step``, A and B, where the grid has several). How it is read or written:

    ``transp``   op(A) = A^T, op(B) = B^T; for C, stored transposed (clconv's CPU kernel only)
    ``fold``     its columns (B, C) or its depth (A) are the positions of several images,
                 ``fold`` each, image q's starting ``per_image`` * q (clconv's GPU kernel only)
    ``pack``     an Operand in the caller's workspace where clconv's CPU kernel packs it first
                 (A^T: :func:`.gemm_cpu.packed_size` elements; B in panels:
                 :func:`.gemm_cpu.panels_size`); other engines and per-group queues ignore it
    ``im2col``   B only: an :class:`.gemm_gpu.Im2colB`, B read in place as the im2col matrix of
                 an input (clconv's GPU kernel only)
    ``half``     stored as float16 (a float16 array read or written as it is, no float32 copy);
                 the grid's dtype is then float32, the one its sums are in (clconv's GPU kernel only)
    """
    buf: object
    off: int
    ld: int
    per_group: int = 0
    per_image: int = 0
    k_step: int = 0
    transp: bool = False
    fold: int = 0
    pack: Optional["Operand"] = None
    im2col: object = None
    half: bool = False

    def at(self, group=0, image=0):
        """The element offset of matrix (group, image)."""
        return self.off + group * self.per_group + image * self.per_image


class Grid(NamedTuple):
    """``gi`` x ``gj`` products (groups or split-K slices by images, or positions), each
    op(A) M x K by op(B) K x N, summed over ``blocks`` blocks of K (the operands' ``k_step``
    apart; clconv's kernels only); ``continuous``: clconv's GPU kernel reads the blocks as one
    depth of blocks x K values, each block's last slice padded with zeros."""
    gi: int
    gj: int
    m: int
    n: int
    k: int
    blocks: int = 1
    continuous: bool = False


class Epilogue(NamedTuple):
    """What a product becomes: C = alpha * op(A) @ op(B) + beta * C."""
    alpha: float = 1.0
    beta: float = 0.0


PLAIN = Epilogue()

"""How much each of clconv's caches keeps: every bounded cache's size, named once, with its reason.

The caches read these as ``limits.NAME`` when they are full (the ``lru_cache`` sizes when their
module is imported). A limit changes how much host memory and how many device objects (kernels,
buffers) a long-running program keeps, never a result or a plan's choices. The caches keyed only
by device, dtype, kernel file or transform size (kernel builds, device facts, twiddles) are
unbounded: a process meets few of each.
"""

# -- plans (clconv.planner) ---------------------------------------------------------------------
PLANS_KEPT = 64          # plans by (geometry, dtype, context, options), least recently used out:
                         # a network's layers with their passes, each plan holding kernels and workspaces
CALLS_KEPT = 256         # functional calls' arguments -> plan, all dropped when full: rare, for a
                         # program calling with that many distinct arguments

# -- replays (clconv.replay) --------------------------------------------------------------------
REPLAYS_KEPT = 8         # per plan, array layouts whose launches are kept (and their bound kernel
                         # copies): a plan is seldom called on more layouts, each kept copy costs memory

# -- arguments (clconv.geometry, clconv.validate, clconv.memory) --------------------------------
GEOMETRIES_KEPT = 1024   # validated convolution arguments remembered; then new ones are checked each call
QUEUES_KEPT = 16         # queues whose context and in-order check are remembered, the last used; each
                         # kept alive while remembered
POOLS_KEPT = 16          # memory pools, for the queues used last; an evicted pool's free blocks are
                         # released (docs: guide/memory)
LAYOUTS_KEPT = 1024      # (shape, dtype) -> C-contiguous strides and size of a new result

# -- GEMM (clconv.gemm.gemm_gpu) ----------------------------------------------------------------
GPU_TILES_KEPT = 4096    # the GPU GEMM's tile choices by (device, M, N, count, itemsize): each plan asks
                         # a handful while it is built

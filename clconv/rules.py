"""The planner's rules: every measured threshold, named once, each with its reason.

The algorithms (:mod:`clconv.algorithms`) and the GEMM engines (:mod:`clconv.gemm`) read these as
``rules.NAME`` when a plan is built, so a test or an experiment can change one in one place. Each
rule's story (what it does, why, and which measurements set it) is told once, in the docs'
algorithms page under the anchor named beside it (docs/guide/algorithms.md#rule-<name>, the name
that ``Plan.explain()`` reports); the measurements themselves are in bench/results/ and the
generated performance pages, not here. Changing a value changes plans: measure first.
"""

# -- split-K (docs: rule-split-k-fill, rule-split-depth) ----------------------------------------
FILL_WAVES = 2            # split K until the grid has this many work-groups per compute unit (GPUs)
MIN_K_SLICE = 256         # and every slice is at least this deep: shorter ones cost more than they gain
MIN_SPLIT_DEPTH = 3 * MIN_K_SLICE   # forwards and grad-inputs less deep: two slices save what their sum costs

# -- partial sums of split-K (docs: rule-partials) ----------------------------------------------
PARTIALS_TARGET = 1 << 24      # aim for at most about this many partial-sum elements
PARTIALS_MIN_SLICE = 256       # shortest slice (GEMM K) worth a partial result of its own
PARTIALS_MAX_SLICES = 64       # most slices a split-K takes where nothing smaller bounds it
PARTIALS_GPU_LOCAL = 256       # work-group of the ordered sum on GPUs: wider groups summed faster

# -- GPU GEMM kernel (docs: rule-gemm-deep-tile, rule-gemm-gpu-planes) ---------------------------
DEEP_K = 1024             # forwards at least this deep on 4x4 work-items take the deep 8x4 tile instead
DEEP_WAVES = 4            # its split-K aims at this many work-groups per compute unit
DEEP_MIN_SHARE = 4        # and only grids of a deep work-group per this many compute units before the split
MAX_PLANES = 4            # in-work-group split-K: at most this many planes of work-items
MIN_PLANE_SLICES = 2      # and a product keeps at least this many K slices with them

# -- CPU GEMM kernel (docs: rule-cpu-gemm-blocks, rule-cpu-gemm-panels) --------------------------
CPU_GEMM_WORK_PER_ITEM = 1 << 19   # multiply-adds a work-item owns at least, else it takes more row blocks
CPU_GEMM_GROUPS_PER_UNIT = 8       # work-groups per compute unit kept at least, for balance between threads
CPU_GEMM_REGISTERS = 16            # vector registers the outer products' block fills: wider blocks ran slower
CPU_GEMM_WIDE_INNER_COLS = 6       # dot products' columns per block on 512-bit CPUs (32 registers)
CPU_GEMM_MAX_VECTOR_BITS = 512     # widest vectors the kernel takes
PANEL_MIN_ROWS = 256               # B packed in panels from op(A) of this many rows,
PANEL_MIN_DEPTH = 256              # a K this deep,
PANEL_MIN_ROW_BYTES = 256          # and rows of B this long: below these the pack costs more than it saves
BT_PANEL_MIN_ROWS = 128            # B^T packed for outer products from op(A) of this many rows
BT_PANEL_MAX_DEPTH = 256           # below this K: there dot products spend as long summing as multiplying

# -- 1x1 (docs: rule-1x1-fold, rule-1x1-weight-blocks, rule-1x1-cpu-transposed) -----------------
POINTWISE_FOLD_BELOW = 256           # GPU forward and grad-input over smaller maps: one GEMM over every image
POINTWISE_CONTINUOUS_BELOW = 64      # GPU grad-weight over smaller maps: K blocks read as one depth
POINTWISE_DEEP_WEIGHT_K = 512        # continuous grad-weights this deep run the deep tile
POINTWISE_DEEP_WEIGHT_SLICE = 128    # in slices at least this deep
POINTWISE_CPU_BLOCKS_BELOW = 700     # CPU grad-weight over smaller maps: one launch in K blocks
POINTWISE_CPU_TRANSPOSED_BELOW = 32  # CPU grad-input over smaller maps runs transposed

# -- direct (docs: rule-direct-taps, rule-direct-stems, rule-direct-kernels) ---------------------
DIRECT_MAX_TAPS = 64              # taps per group on GPUs (and most CPU grad-weights): above, GEMMs pay again
DIRECT_CPU_MAX_TAPS = 216         # taps per group on CPUs, forward and grad-input
DIRECT_CPU_MAX_WEIGHT_TAPS = 144  # taps per group of a stride-1 grad-weight on CPUs
DIRECT_MAX_FILTERS = 64           # filters per group: above, a GEMM over them pays again
DIRECT_MAX_DENSE_CHANNELS = 4     # a dense convolution of at most this many input channels (stems)
DIRECT_MAX_DENSE_TAPS = 4 * 7 * 7  # and taps applies whatever its filters
DIRECT_IN_PLACE_USES = 4          # GPU forward reads its input in place where a value feeds at most this many sums
DIRECT_PLANE_USES = 16            # and stages planes in turn where it feeds at least this many
DIRECT_PLANES = 4                 # planes per work-group in either form
DIRECT_GROUPS_PER_UNIT = 8        # work-groups per compute unit those planes must leave
DIRECT_CPU_ITEMS_PER_UNIT = 8     # CPU row kernels: work-items per compute unit, at least
DIRECT_CPU_MAX_FILTERS = 8        # and filters per work-item: 8 vector sums beside an input and a weight
DIRECT_SHORT_ROW_VECTORS = 1      # CPU rows of at most this many vectors load each tap row once
DIRECT_SHORT_ROW_ACC = 8          # while filters x vectors (the accumulators) stay within this
DIRECT_ROW_BLOCK = 8              # CPU row kernels sum up to this many rows at once
DIRECT_BAND_BYTES = 32768         # CPU rows copy their input band into local memory up to this size
DIRECT_BAND_MIN_USES = 4          # where a copied value feeds at least this many multiply-adds
DIRECT_BAND_MIN_EDGES = 0.25      # or at least this share of the row's vector loads is at an edge

# -- fft (docs: rule-fft) ------------------------------------------------------------------------
FFT_MIN_CHANNELS = 16             # fewer channels or filters per group: per-frequency GEMMs too thin
FFT_GPU_MIN_FLOP_PER_UNIT = 2.5e6  # less work a pass per GPU compute unit: its launches cost more than im2col

# -- winograd (docs: rule-winograd-channels, -gpu-work, -cpu-tiles, -cpu-pieces, -weight-split) ---
WINOGRAD_MIN_CHANNELS = 16              # fewer channels or filters per group: batched GEMMs too thin
WINOGRAD_CPU_MIN_TILES = 32             # CPUs, maps of 4 tiles: fewer tiles a batch make GEMMs too narrow
WINOGRAD_GPU_MIN_FLOP_PER_UNIT = 6.5e6  # less work a pass per GPU compute unit: its four launches do not pay
WINOGRAD_GPU_SPLIT_K_TARGET = 1 << 21   # GPU grad-weight partial sums of at most about this many elements
WINOGRAD_CPU_PIECE_BYTES = 32 << 20     # CPU forward and grad-input cut images above this into pieces

# -- im2col (docs: rule-im2col-*) -----------------------------------------------------------------
IM2COL_GPU_MIN_SLICE = 64            # GPU grad-weight slices at least this long,
IM2COL_GPU_MAX_SLICES = 256          # at most this many: more work-groups for few outputs
IM2COL_GPU_FILL_WAVES = 4            # and the fewest whose grid has this many work-groups per compute unit
IM2COL_GPU_MIN_SPLIT_POSITIONS = 256  # GPU grad-weight chunks of fewer positions are not split
IM2COL_IMPLICIT_MAX_CHANNELS = 4     # GPU: input read through im2col in place up to this many channels per group
IM2COL_GPU_IMPLICIT_FLOP_PER_UNIT = {"forward": 4e6, "backward_weight": 1.2e6}   # and passes of less work
IM2COL_SCALAR_FOLD_MAX_TAPS = 64     # GPU grad-weight reads grad_output in place value by value up to this N
IM2COL_CPU_IMAGE_POSITIONS = 3136    # CPU forwards of this many positions an image run image by image
IM2COL_CPU_IMAGE_WORK = 8e6          # where an image's GEMM has this much work per compute unit
IM2COL_CPU_SPLIT_BELOW = 1 << 16     # CPU grad-weight split-K only for results of fewer values
IM2COL_CPU_COL_BYTES = 4 << 20       # CPU col per image above this: tiles of output rows within the caches

# -- the default device (docs: guide/devices.md, "Choosing a device") --------------------------
PREFER_NEWER_POCL = True   # of two PoCLs that build, the newer: it knows newer CPUs and measured faster

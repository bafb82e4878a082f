// Prepended by the builder (clconv/programs.py) to every kernel file, after the host's
// #defines: the defaults every file reads with, and the helpers they all use.
#ifndef REAL           // arithmetic type: float or double (float for float16 storage)
#define REAL float
#endif
#ifndef STORE          // element type in memory: REAL, or half (float16 storage, REAL = float)
#define STORE REAL
#define LOAD(p, i) ((p)[i])
#define SAVE(p, i, v) ((p)[i] = (v))
#endif
#ifndef IDX            // index type: int when every index formed is below 2^31, else long
#define IDX long
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define REAL4 CAT(REAL, 4)
#define REALV CAT(REAL, VW)   // VW values: files of CPU row kernels define VW

// The epilogue flags of the kernels that write a forward pass's output (clconv/bias.py).
#define EPI_BIAS 1             // add bias[k]
#define EPI_RELU 2             // then max(v, 0)
#define EPI_ADD 4              // (fill_bias) onto the output's values, instead of onto 0
#define EPILOGUE(flags, v) (((flags) & EPI_RELU) && (v) < (REAL)0 ? (REAL)0 : (v))

// The smallest real kernel (clconv/probe.py): whether a device builds and runs clconv's
// kernels at all, asked before it becomes the default device and before a plan runs on it.
__kernel void probe(__global REAL* restrict x, const int n)
{
    const int i = get_global_id(0);
    if (i < n)
        x[i] = MADD(x[i], (REAL)2, (REAL)1);
}

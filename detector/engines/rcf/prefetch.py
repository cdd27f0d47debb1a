"""Software prefetch for the forest kernels: LLVM's ``llvm.prefetch``, which numba lacks.

Scoring a point chases pointers through one model's trees, boxes and points (about 256 KB).
With more models than fit in cache each walk would wait on a miss at every step; reading
the model sequentially first lets the hardware stream it in, but the reads still wait.
Prefetch instructions do not: issued for the next row's model while the current row is
walked, they bring it into L2 in the background (measured in benchmarks/forest.py).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_CACHE_LINE = 64
_READ = 0
_KEEP_IN_L2 = 2  # locality 2: prefetcht1 on x86 (L2 and outward; L1 is too small)
_DATA = 1


@intrinsic
def _prefetch(typingctx, array, index):
    """Hint that ``array[index]`` will be read soon; never faults, returns nothing."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None
    sig = types.void(array, index)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(i32, _READ), ir.Constant(i32, _KEEP_IN_L2),
                          ir.Constant(i32, _DATA)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def prefetch_lines(flat: np.ndarray, end: int) -> None:
    """Prefetch every cache line of ``flat[:end]`` (a contiguous 1-D array)."""
    step = max(_CACHE_LINE // flat.itemsize, 1)
    for k in range(0, end, step):
        _prefetch(flat, k)  # type: ignore[call-arg]  # numba passes the typing context

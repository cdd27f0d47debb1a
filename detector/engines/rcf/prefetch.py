"""Software prefetch for the forest kernels: LLVM's ``llvm.prefetch``, which numba lacks.

Scoring a point chases pointers through one model's trees, boxes and points (about 256 KB).
With more models than fit in cache, every step of that walk would wait on a miss. The
kernels prefetch the next row's model while the current row is walked, one tree's arrays
and a share of its points per tree walked. All of a model's ~4,000 lines at once do not
work when they come from DRAM: most of the hints are dropped (measured at 256 models:
12.3 k updates/s, against 14.5 k for reading each model sequentially before its walk, and
15.7 k tree by tree; at 16 models, which fit in L3, both kinds of prefetch beat the
sequential read).
"""

from __future__ import annotations

from collections.abc import Callable

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
        # The intrinsic is named for its pointer type: p0 where llvmlite emits opaque
        # pointers, p0i8 where it still emits typed ones (LLVM upgrades that name).
        name = "llvm.prefetch.p0" if getattr(ptr.type, "is_opaque", False) else "llvm.prefetch.p0i8"
        fn = cgutils.get_or_insert_function(builder.module, fnty, name)
        builder.call(fn, [ptr, ir.Constant(i32, _READ), ir.Constant(i32, _KEEP_IN_L2),
                          ir.Constant(i32, _DATA)])
        return context.get_dummy_value()

    return sig, codegen


prefetch: Callable[[np.ndarray, int], None] = _prefetch  # type: ignore[assignment]
"""``prefetch(array, flat_index)`` in a numba kernel: the hint for ``array``'s element at
that C-order index. (The same intrinsic, typed as kernels call it; numba supplies the typing
context.)"""


@njit(cache=True)
def prefetch_lines(flat: np.ndarray, end: int) -> None:
    """Prefetch every cache line of ``flat[:end]`` (a contiguous 1-D array)."""
    step = max(_CACHE_LINE // flat.itemsize, 1)
    for k in range(0, end, step):
        prefetch(flat, k)

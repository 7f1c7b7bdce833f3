"""The built-in ops, one ``Op`` class each, grouped by kind (see each module's docstring; chapter 02).

An op's class holds everything about it: forward, backward, and the declarations that fusion,
code generation, ONNX export and autocast read (``minigrad.ops.op`` lists them). Adding an op is
its class, its wrapper function, and one row of ``tests/op_table.py``.
"""

from minigrad.ops.op import Op, all_ops  # noqa: F401

from minigrad.ops.elementwise import *  # noqa: F401,F403
from minigrad.ops.elementwise import absolute as abs, power as pow  # noqa: F401  (builtins' names: not in the module)
from minigrad.ops.compare import *  # noqa: F401,F403
from minigrad.ops.activation import *  # noqa: F401,F403
from minigrad.ops.movement import *  # noqa: F401,F403
from minigrad.ops.reduce import *  # noqa: F401,F403
from minigrad.ops.reduce import (  # noqa: F401  (builtins' names: reduce.py keeps Python's for its backward rules)
    reduce_all as all, reduce_any as any, reduce_max as max, reduce_min as min, reduce_sum as sum,
)
from minigrad.ops.softmax import *  # noqa: F401,F403
from minigrad.ops.linalg import *  # noqa: F401,F403
from minigrad.ops.indexing import *  # noqa: F401,F403
from minigrad.ops.masking import *  # noqa: F401,F403
from minigrad.ops.sampling import *  # noqa: F401,F403
from minigrad.ops.inplace import copy_from, fill_, inplace  # noqa: F401
from minigrad.ops.conv import *  # noqa: F401,F403
from minigrad.ops.pool import *  # noqa: F401,F403
from minigrad.ops.recurrent import *  # noqa: F401,F403
from minigrad.ops import normalize  # noqa: F401,E402  (Standardize, which nn.functional applies)
from minigrad.ops.layout import *  # noqa: F401,F403
from minigrad.ops import sparse  # noqa: F401,E402  (COO tensors: minigrad.sparse)

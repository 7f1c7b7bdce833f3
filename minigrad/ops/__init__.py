"""The built-in ops, one ``Function`` each, grouped by kind (see each module's docstring)."""

from minigrad.ops.elementwise import *  # noqa: F401,F403
from minigrad.ops.activation import *  # noqa: F401,F403
from minigrad.ops.movement import *  # noqa: F401,F403
from minigrad.ops.reduce import *  # noqa: F401,F403
from minigrad.ops.softmax import *  # noqa: F401,F403
from minigrad.ops.linalg import *  # noqa: F401,F403
from minigrad.ops.indexing import *  # noqa: F401,F403
from minigrad.ops.inplace import copy_from, fill_, inplace  # noqa: F401
from minigrad.ops.conv import *  # noqa: F401,F403
from minigrad.ops.pool import *  # noqa: F401,F403

"""Graph passes: functions ``Graph -> Graph`` that make a traced graph cheaper to run (chapter 03).

Each pass returns a new graph and leaves its input alone (``rewrite.py`` is how): dead code
elimination, constant folding, common subexpression elimination, algebraic simplification,
BatchNorm folding (on modules: ``minigrad.nn.fusion``) and elementwise fusion. ``PassManager``
runs a list of them and reports what each changed.
"""

from minigrad.graph.passes.constant_folding import fold_constants, frozen_parameters
from minigrad.graph.passes.cse import eliminate_common_subexpressions
from minigrad.graph.passes.dce import eliminate_dead_code
from minigrad.graph.passes.fusion import MAX_GROUP_SIZE, fuse_elementwise, fusion_groups
from minigrad.graph.passes.fold_bn import fold_batch_norm, fold_weights
from minigrad.graph.passes.manager import PassManager, PassRecord, default_passes, pass_name
from minigrad.graph.passes.rewrite import DROP, Rewriter, is_pure, is_random, live_nodes, rewrite
from minigrad.graph.passes.simplify import simplify

__all__ = [
    "DROP", "PassManager", "PassRecord", "Rewriter", "default_passes", "is_random",
    "eliminate_common_subexpressions", "eliminate_dead_code", "fold_batch_norm", "fold_constants",
    "fold_weights", "frozen_parameters", "is_pure",
    "live_nodes", "pass_name", "rewrite", "simplify",
]
__all__ += ["MAX_GROUP_SIZE", "fuse_elementwise", "fusion_groups"]

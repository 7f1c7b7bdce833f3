"""Chapter 03's regions where the lesson's own tests leave a mistake through: checks with values
worked out by hand, run without PyTorch by ``python -m minigrad.course mutants 3`` (the other
chapter 03 regions are caught by test_passes, test_fusion, test_amp, test_memory and
test_checkpoint). A failure states the contract the region breaks.
"""

import numpy as np

import minigrad as mg
from minigrad.graph import trace
from minigrad.graph.passes import fold_constants
from minigrad.graph.trace import run_graph
from helpers import to_numpy


class TestConstantFolding:
    def test_a_frozen_parameter_is_a_snapshot_even_when_read_as_it_is(self):
        # x @ W reads the parameter itself: freezing must copy it, or W's next update leaks into the
        # "constant" of the inference graph
        W = mg.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=mg.float64, requires_grad=True)
        traced = trace(lambda x: x @ W, mg.ones(1, 2, dtype=mg.float64))
        frozen = fold_constants(traced.graph, freeze=True)
        assert "parameter" not in [n.op for n in frozen.topological_order()]
        with mg.no_grad():
            W.mul_(3.0)
        (out,) = run_graph(frozen, [mg.tensor([[1.0, 1.0]], dtype=mg.float64)])
        np.testing.assert_array_equal(to_numpy(out), [[4.0, 6.0]], err_msg=(
            "constant folding with freeze=True takes a copy of each parameter: a later in-place update "
            "of the parameter must not change the folded graph"))

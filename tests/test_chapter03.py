"""Chapter 03's regions where the lesson's own tests leave a mistake through: checks with values
worked out by hand, run without PyTorch by ``python -m minigrad.course mutants 3`` (the other
chapter 03 regions are caught by test_passes, test_fusion, test_amp, test_memory and
test_checkpoint), and the numpy-block kernel's expression walk, whose generated code must compute
what eager ops compute in as few scratch buffers as the contract allows. A failure states the
contract the region breaks.
"""

import numpy as np

import minigrad as mg
from minigrad.graph import trace
from minigrad.graph.codegen import cpu
from minigrad.graph.passes import fold_constants, fuse_elementwise
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


def block_kernel(fn, *inputs):
    """The numpy-block kernel of the one fused group of ``fn``'s graph, and its block function's
    parameters (``o``, the inputs, then the scratch buffers)."""
    graph = fuse_elementwise(trace(fn, *inputs).graph)
    (node,) = [n for n in graph if n.op == "fused"]
    kernel = cpu.generate(node.meta["group"])
    params = kernel.source.split("def block(")[1].split(")")[0].split(", ")
    return kernel, params


class TestBlockKernel:
    x = mg.tensor([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0], dtype=mg.float64)

    def test_a_chain_computes_its_value_into_the_output_in_one_scratch_buffer(self):
        kernel, params = block_kernel(lambda x: ((x * 2).tanh() + x).exp(), self.x)
        x = self.x.numpy()
        out = np.full(x.shape, np.nan)  # fresh memory might hold the result already: the trace computed it
        np.testing.assert_allclose(kernel(x, out=out), np.exp(np.tanh(x * 2) + x), rtol=1e-15, err_msg=(
            "the kernel computes ((x * 2).tanh() + x).exp(): each op reads the buffers its inputs were "
            "written to, and the last op writes the output block o"))
        scratch = [p for p in params if p.startswith("s")]
        assert scratch == ["s0"], (
            f"a chain of one-ufunc ops needs one scratch buffer: each op overwrites the buffer of the value it "
            f"reads last; the block function takes {params}")

    def test_a_value_read_again_later_keeps_its_buffer_until_then(self):
        # h = x * 2 is read by h + 1 and again by the final multiply: its buffer is not free before that
        kernel, params = block_kernel(lambda x: ((x * 2) + 1).exp() * (x * 2).sin(), self.x)
        x = self.x.numpy()
        np.testing.assert_allclose(kernel(x), np.exp(x * 2 + 1) * np.sin(x * 2), rtol=1e-15, err_msg=(
            "a scratch buffer is free only after the last op that reads its value"))
        kernel, params = block_kernel(lambda x: (lambda h: (h + 1).exp() * h)(x * 2), self.x)
        np.testing.assert_allclose(kernel(x), np.exp(x * 2 + 1) * (x * 2), rtol=1e-15, err_msg=(
            "h = x * 2 is read by h + 1 and again by the last multiply: its buffer must not be reused in between"))
        assert [p for p in params if p.startswith("s")] == ["s0", "s1"], (
            f"h and h + 1 are alive together: two scratch buffers, no more; the block function takes {params}")

    def test_an_op_of_several_calls_never_writes_over_its_input(self):
        # hardswish is four ufunc calls; its first writes the output before the third reads the input
        hardswish = mg.nn.functional.hardswish
        kernel, params = block_kernel(lambda x: hardswish(hardswish(x * 2)) + 1, self.x)
        x = self.x.numpy() * 2
        once = x * np.clip(x + 3, 0, 6) / 6
        np.testing.assert_allclose(kernel(self.x.numpy()), once * np.clip(once + 3, 0, 6) / 6 + 1, rtol=1e-15,
                                   err_msg=("an op of several ufunc calls writes its output before it has read all "
                                            "of its input: it needs a destination other than its input's buffer"))
        assert [p for p in params if p.startswith("s")] == ["s0", "s1"], (
            f"x * 2 is dead once the first hardswish has read it: the second hardswish writes into its freed "
            f"buffer, so two scratch buffers suffice; the block function takes {params}")

    def test_a_kernel_by_rows_normalises_each_row(self):
        x = mg.tensor([[1.0, 2.0, 3.0, 6.0], [0.0, -1.0, 4.0, 1.0]], dtype=mg.float64)
        kernel, _ = block_kernel(lambda x: ((x * 2 - (x * 2).mean(1, keepdim=True)).exp() + 1), x)
        a = x.numpy() * 2
        np.testing.assert_allclose(kernel(x.numpy()), np.exp(a - a.mean(1, keepdims=True)) + 1, rtol=1e-15)

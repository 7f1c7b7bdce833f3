"""The backward pass: walk the recorded graph from the loss to the leaves (chapter 02).

``topological_order`` lists the nodes reachable from the roots so that every node comes before
the nodes it points to (its inputs). Walking that list once, each node receives the sum of the
gradients of all its consumers before it runs, calls its ``backward``, and passes one gradient
down each in-edge. The walk is iterative, so a chain of 100,000 ops does not hit Python's
recursion limit. Gradients that were broadcast in forward are summed back to the input's shape
here, once for every op. ``create_graph=True`` records the backward pass itself, which is how
higher-order derivatives (``autograd.functional``) are computed. The walk is parameterised by
the binding of ``ctx.ops`` (``binding.py``): Tensors and minigrad's ops when the pass is recorded
(``create_graph=True``, or any mode on the stack), raw arrays when nobody records, which is the
same walk without a Tensor or node per gradient; hooks, ``.grad`` and the gradients ``grad()``
returns are Tensors under either binding. While a pass runs, ops are
backward rules (``minigrad.autograd.is_backward_running()``), and the modes hear of each node's
gradients and of each leaf's first ``.grad``.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from minigrad.autograd import function as F
from minigrad.autograd.binding import TENSOR_OPS, ArrayOps, TensorOps, array_ops
from minigrad.autograd.function import AccumulateGrad, Function
from minigrad.autograd.grad_mode import set_grad_enabled
from minigrad.autograd.mode import backward_pass, current_modes
from minigrad.backend import selected
from minigrad.errors import AutogradError, ShapeError
from minigrad._tensor import Tensor, _wrap


def topological_order(roots: Iterable[Function]) -> list[Function]:
    """Nodes reachable from ``roots``, each before every node it depends on (reverse post-order
    of an iterative depth-first search).

    ``roots`` are nodes (``t.grad_fn``, or a leaf's ``AccumulateGrad``). A node's inputs are its
    ``_edges``: one tuple per argument of its forward, ``(input_node, output_nr, shape, dtype)``,
    whose ``input_node`` is ``None`` for an argument that needs no gradient (``_connect``, in
    ``function.py``). Return a new list holding every node reachable from the roots exactly once
    (a node reached along several paths, as ``h`` in ``h * h + h``, is listed once), in which each
    node comes before every input node of its ``_edges``; an unreachable node is never listed. What is checked: that order on
    diamonds and shared subgraphs, roots that reach each other, and a chain of 100,000 nodes:
    the walk must keep its own stack, since Python's recursion limit is about 1,000. Hint: a
    depth-first search that appends a node once all its inputs are done (post-order), then the
    list reversed.
    """
    ### BEGIN SOLUTION chapter 01: topological order
    order: list[Function] = []
    visited: set[Function] = set()
    for root in roots:
        if root in visited:
            continue
        visited.add(root)
        stack = [(root, iter(root._edges))]
        while stack:
            node, edges = stack[-1]
            for edge in edges:
                nxt = edge[0]
                if nxt is not None and nxt not in visited:
                    visited.add(nxt)
                    stack.append((nxt, iter(nxt._edges)))
                    break
            else:
                stack.pop()
                order.append(node)
    order.reverse()
    return order
    ### END SOLUTION


def consumers(roots: Iterable[Function]) -> dict[Function, list[Function]]:
    """The out-edges: for every node reachable from ``roots``, the nodes that use its output."""
    users: dict[Function, list[Function]] = {}
    for node in topological_order(roots):
        users.setdefault(node, [])
        for edge in node._edges:
            if edge[0] is not None:
                users.setdefault(edge[0], []).append(node)
    return users


def backward(tensor: Tensor, gradient: Tensor | None = None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs: Sequence[Tensor] | None = None) -> None:
    """``tensor.backward()``: accumulate gradients into the ``.grad`` of leaves (or of ``inputs``)."""
    _run([tensor], [gradient], retain_graph, create_graph, inputs, accumulate=True)


def grad(outputs: Tensor | Sequence[Tensor], inputs: Tensor | Sequence[Tensor],
         grad_outputs: Tensor | Sequence[Tensor | None] | None = None, retain_graph: bool | None = None,
         create_graph: bool = False, only_inputs: bool = True,
         allow_unused: bool = False) -> tuple[Tensor | None, ...]:
    """The gradients of ``outputs`` with respect to ``inputs``, returned instead of accumulated.

    ``only_inputs`` is accepted and ignored, as in torch, where it is deprecated: gradients only
    ever go to ``inputs`` (old code still passes it, in torch's argument position)."""
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if grad_outputs is None or isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs] * len(outputs) if grad_outputs is None else [grad_outputs]
    if len(grad_outputs) != len(outputs):
        raise AutogradError(f"grad: got {len(grad_outputs)} grad_outputs for {len(outputs)} outputs")
    result = _run(outputs, list(grad_outputs), retain_graph, create_graph, inputs, accumulate=False)
    for i, (t, g) in enumerate(zip(inputs, result)):
        if g is None and not allow_unused:
            raise AutogradError(
                f"grad: input {i} (shape {tuple(t.shape)}) was not used to compute the outputs; "
                "pass allow_unused=True to get None for it"
            )
    return tuple(result)


def _root_node(t: Tensor, i: int) -> tuple[Function, int]:
    if t.grad_fn is not None:
        return t.grad_fn, t._output_nr
    if t.requires_grad:
        return F._accumulator(t), 0
    raise AutogradError(f"element {i} of tensors does not require grad and does not have a grad_fn")


def _root_grad(t: Tensor, g: Tensor | None) -> Tensor:
    if g is None:
        if t.array.size != 1:
            raise AutogradError(
                f"backward: grad can be implicitly created only for scalar outputs, got shape "
                f"{tuple(t.shape)}; pass gradient= a tensor of that shape"
            )
        with selected(t.device):  # on the output's GPU, where its backward runs
            return _wrap(t.device.xp.ones(t.shape, t.dtype), t.device)
    if not isinstance(g, Tensor):
        g = Tensor(g, dtype=t.dtype, device=t.device)
    if g.shape != t.shape:
        raise ShapeError(f"backward: gradient has shape {tuple(g.shape)} but the output has shape {tuple(t.shape)}")
    return g


def _run(roots: list[Tensor], root_grads: list, retain_graph: bool | None, create_graph: bool,
         inputs: Sequence[Tensor] | None, accumulate: bool) -> list:
    if retain_graph is None:
        retain_graph = create_graph
    # The binding of every rule in this pass: differentiable ops when the pass is recorded (or a
    # mode watches it), raw arrays when nobody records (binding.py). Gradients are values of the
    # binding inside the walk and Tensors wherever they leave it (hooks, .grad, captured).
    ops = TENSOR_OPS if create_graph or current_modes() else None
    buffers: dict[Function, list] = {}
    # ids of gradient tensors that something else may hold (the caller, a hook, two inputs of one
    # node): a leaf stores a copy of those, and keeps any other gradient as its .grad without copying
    shared: set[int] = set()
    for i, (t, g) in enumerate(zip(roots, root_grads)):
        node, nr = _root_node(t, i)
        buf = buffers.setdefault(node, [None] * node._n_outputs)
        g = _root_grad(t, g)
        if ops is None:
            ops = array_ops(t.device)
        g = ops.value(g)
        shared.add(id(g))
        buf[nr] = g if buf[nr] is None else buf[nr] + g
    order = topological_order(buffers)

    # Where gradients are wanted: every leaf, or only the given inputs (captured at their node).
    targets: dict[tuple[Function, int], int] | None = None
    needed: set[Function] | None = None
    if inputs is not None:
        inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
        targets = {}
        for i, t in enumerate(inputs):
            if not isinstance(t, Tensor) or not t.requires_grad:
                raise AutogradError(f"input {i} does not require grad, so no gradient can be computed for it")
            targets[_root_node(t, i)] = i
        needed = _needed(order, {node for node, _ in targets})
    captured: list = [None] * (len(inputs) if inputs is not None else 0)

    with backward_pass():
        _walk(order, buffers, needed, targets, captured, accumulate, retain_graph, create_graph, shared, ops)
    if ops.arrays:
        captured = [None if g is None else ops.tensor(g, t.device) for g, t in zip(captured, inputs or ())]

    if accumulate and targets is not None:  # backward(inputs=[non-leaf, ...]) fills their .grad too
        for t, g in zip(inputs, captured):
            if g is not None and t.grad_fn is not None:
                t.grad = g if t.grad is None else t.grad + g
    return captured


def _walk(order: list[Function], buffers: dict, needed: set | None, targets: dict | None, captured: list,
          accumulate: bool, retain_graph: bool, create_graph: bool, shared: set[int],
          ops: TensorOps | ArrayOps = TENSOR_OPS) -> None:
    """Run every node in topological order: each has all its incoming gradients when reached.

    ``order``: every node reachable from the roots, from ``topological_order``.
    ``buffers``: node -> list with one slot per output of the node (``node._n_outputs``), each the
    sum of the gradients that reached that output so far, or ``None``. ``_run`` filled the roots';
    ``_call_backward`` adds into the slots of a node's inputs. Take a node's list out
    (``buffers.pop``) when you reach it; a node no gradient reached is skipped.
    ``needed``: ``None`` (every node runs), or the nodes from which a wanted input can be
    reached (``grad(outputs, inputs)``): skip the others.
    ``targets``: ``None``, or ``(node, output_nr) -> i`` for the ``inputs`` of ``grad`` /
    ``backward(inputs=...)``; ``captured[i]`` then gets (adds up) the gradient reaching that slot.
    ``accumulate``: True for ``backward`` (leaves' ``.grad`` grow), False for ``grad`` (nothing
    is stored in any ``.grad``; the gradients come back in ``captured``).
    ``retain_graph``: passed to ``_call_backward`` (False frees each node's saved tensors).
    ``create_graph``: run the whole walk under ``set_grad_enabled(create_graph)``, so that the
    backward rules are recorded for higher-order derivatives only when asked.
    ``shared``: ids of gradients something else may also hold; pass it to ``_accumulate`` and
    ``_call_backward``.
    ``ops``: the binding of the pass (``minigrad.autograd.binding``): the gradients in ``buffers``
    are its values, Tensors or raw arrays. Set ``node.ops = ops.on(node.device)`` before calling a node's backward
    (that is ``ctx.ops`` in its rule); a pre-hook and a leaf see Tensors: ``ops.tensor(g)``
    turns a value into one (itself under the Tensor binding) and ``ops.value(t)`` turns it back.

    For each node: run its pre-hooks first (``node._pre_hooks.values()``, each called with the
    list of gradients and returning a replacement list or ``None``); then capture targets; an
    ``AccumulateGrad`` node (a leaf; the leaf is ``node.variable``) goes to ``_accumulate`` when
    ``accumulate`` is true and the leaf is wanted (every leaf when ``targets`` is None), and has no
    backward to call; with ``targets``, a node none of whose ``_edges`` leads to a needed node is not
    called either (its saved tensors stay); every other node goes to ``_call_backward``.
    """
    ### BEGIN SOLUTION chapter 02: the backward engine: nodes in order
    with set_grad_enabled(create_graph):
        for node in order:
            grads = buffers.pop(node, None)
            if grads is None or (needed is not None and node not in needed):
                continue
            if node._pre_hooks:
                grads = [None if g is None else ops.tensor(g) for g in grads]
                for hook in tuple(node._pre_hooks.values()):
                    new = hook(grads)
                    if new is not None:
                        grads = new
                grads = [None if g is None else ops.value(g) for g in grads]
            if targets is not None:
                for nr, g in enumerate(grads):
                    i = targets.get((node, nr))
                    if i is not None and g is not None:
                        captured[i] = g if captured[i] is None else captured[i] + g
            if type(node) is AccumulateGrad:
                if accumulate and grads[0] is not None and (targets is None or (node, 0) in targets):
                    _accumulate(node.variable, grads[0], create_graph, shared, ops)
                continue
            if targets is not None and not any(e[0] in needed for e in node._edges):
                continue  # a wanted node with nothing wanted below it: capture only, keep its saved tensors
            node.ops = ops if node.device is ops.device else ops.on(node.device)  # (a call less per node)
            _call_backward(node, grads, buffers, retain_graph, shared)
    ### END SOLUTION


def _needed(order: list[Function], wanted: set[Function]) -> set[Function]:
    """Nodes from which a wanted node can be reached; the others need not run."""
    needed = set()
    for node in reversed(order):  # inputs before their consumers
        if node in wanted or any(e[0] in needed for e in node._edges):
            needed.add(node)
    return needed


def _call_backward(node: Function, grads: list, buffers: dict, retain_graph: bool, shared: set[int]) -> None:
    """Call ``node``'s backward rule and add each input's gradient into ``buffers``.

    ``grads`` has one entry per output of the node, ``None`` where no gradient arrived; a node of
    several outputs gets zeros there instead (``node._output_meta`` gives each output's
    ``(shape, dtype)``; ``ops.zeros(shape, dtype, node.device)``, where ``ops = node.ops`` is the
    binding ``_walk`` set). Call the rule as ``type(node).backward(node, *grads)``, or, when the
    binding is arrays but the rule reads Tensors only (``node.tensor_backward``), as
    ``_tensor_rule(node, grads)``: it returns one gradient per entry of ``node._edges``
    (a bare value counts as a 1-tuple; fewer than that is an ``AutogradError`` that names the
    node and both counts). Tell each mode of
    ``current_modes()`` with ``m.node_backward(node, out)``. Then for each input edge
    ``(next_node, nr, shape, dtype)`` of ``node._edges`` (one per argument of forward; skip those
    whose ``next_node`` or gradient is ``None``): a gradient whose shape differs from the input's
    (``shape``: its ``.array``'s when forward ran) was broadcast in forward, so ``_unbroadcast``
    it; a gradient of another dtype
    is cast to the input's (``ops.cast(g, dtype)``); add it into ``buffers[next_node][nr]`` (a new list of
    ``next_node._n_outputs`` slots when missing), out of place (``a + b``), since another node may
    hold the tensor. A gradient that is one of ``grads`` passed through, or that comes from a
    user-defined Function (``not node.array_forward``, unless it declares ``owns_gradients``: its
    gradients are fresh arrays nobody else holds), may be held elsewhere: add its id to
    ``shared``. Last, unless ``retain_graph``, free the saved tensors: ``node._saved = F._FREED``
    (a second backward through the node then says so).
    """
    ### BEGIN SOLUTION chapter 02: the backward engine: one node, retain_graph
    ops, device = node.ops, node.device
    gpu = selected(device) if device.type == "cuda" else None  # cupy computes on the current GPU (the cpu: no call)
    if gpu is not None:
        gpu.__enter__()
    try:
        if node._n_outputs > 1:  # a multi-output op gets zeros for outputs that received no gradient
            grads = [g if g is not None else ops.zeros(shape, dtype, device)
                     for g, (shape, dtype) in zip(grads, node._output_meta)]
        out = _tensor_rule(node, grads) if ops.arrays and node.tensor_backward else type(node).backward(node, *grads)
    finally:
        if gpu is not None:
            gpu.__exit__(None, None, None)
    if type(out) is not tuple:
        out = (out,)
    edges = node._edges
    if len(out) < len(edges):
        raise AutogradError(f"{node.name()}.backward returned {len(out)} gradient(s), expected {len(edges)} "
                            "(one per forward input)")
    modes = current_modes()
    if modes:
        for m in modes:
            m.node_backward(node, out)
    for (nxt, nr, shape, dtype), g in zip(edges, out):
        if nxt is None or g is None:
            continue
        owned = node.array_forward or getattr(node, "owns_gradients", False)  # checkpoint's: fresh arrays
        if not owned or g is grads[0] or (len(grads) > 1 and any(g is gi for gi in grads)):
            shared.add(id(g))  # passed through, or from a user backward that may keep it
        data = g.array if type(g) is Tensor else g  # an array, or a sparse gradient (minigrad.ops.sparse)
        if data.shape != shape:
            g = _unbroadcast(node, g, shape)
        if data.dtype is not dtype and data.dtype != dtype:
            g = ops.cast(g, dtype)
        buf = buffers.get(nxt)
        if buf is None:
            buf = buffers[nxt] = [None] * nxt._n_outputs
        buf[nr] = g if buf[nr] is None else buf[nr] + g  # out of place: another node may hold buf[nr]
    if not retain_graph and node._saved is not None:
        node._saved = F._FREED
    ### END SOLUTION


def _tensor_rule(node: Function, grads: list) -> tuple:
    """Under the array binding, ``node``'s backward when it reads Tensors only (a user Function,
    or an op that declares ``tensor_backward``): it gets Tensors, as PyTorch's would, and its
    results come back as arrays; a sparse gradient for a leaf stays sparse (``.grad`` keeps it)."""
    ops = node.ops
    node.ops = TENSOR_OPS  # its saved_tensors are Tensors
    try:
        out = type(node).backward(node, *[None if g is None else ops.tensor(g) for g in grads])  # (on g's device)
    finally:
        node.ops = ops
    if type(out) is not tuple:
        out = (out,)
    edges, values = node._edges, []
    for i, g in enumerate(out):
        if g is not None and not (g.is_sparse and i < len(edges) and type(edges[i][0]) is AccumulateGrad):
            g = ops.value(g)
        values.append(g)
    return tuple(values)


def _unbroadcast(node: Function, g: Any, shape: tuple) -> Any:
    sum_to = node.ops.sum_to
    try:
        return sum_to(g, shape)
    except ShapeError:
        raise ShapeError(
            f"{node.name()}.backward returned a gradient of shape {tuple(g.shape)} for an input of "
            f"shape {tuple(shape)}"
        ) from None


def _accumulate(t: Tensor, g: Any, create_graph: bool, shared: set[int], ops: TensorOps | ArrayOps = TENSOR_OPS) -> None:
    """Add ``g`` into a leaf's ``.grad`` (after the leaf's hooks). A gradient the engine made for
    this leaf alone is stored as is; one that may be visible elsewhere is copied first.

    First run the leaf's hooks (``t._hooks.values()``: each is called with ``g`` and returns a
    replacement or ``None``); after a hook, ``g`` may be held by it, so its id goes into
    ``shared``. If ``t.grad`` exists, the new ``.grad`` is ``t.grad + g`` (out of place: a new
    tensor; for a sparse ``g``, ``g + t.grad``), and return: the lines after your code are for a
    leaf's first gradient only. Otherwise ``g`` becomes ``t.grad``: itself under ``create_graph``
    (the graph it carries is the point) or when sparse; a copy when something else may hold it
    (``id(g) in shared``: a caller's gradient, a hook's, one passed through ``a + b`` to two
    leaves at once) or when it is a view of another array (``g.array.base is not None``), since an
    in-place change of one ``.grad`` (``zero_grad``, ``p.grad.mul_``) must not change another
    tensor. A gradient stored without copying goes into ``shared``, so that the same tensor
    reaching another leaf is copied there. What is checked: after ``a.grad.add_(1)`` in place, no
    other leaf's ``.grad`` and no tensor the caller passed in has changed, and a second backward
    adds to the first.
    """
    ### BEGIN SOLUTION chapter 02: the backward engine: accumulating .grad
    key = id(g)  # what ``shared`` knows the gradient by: the binding's value (a Tensor or an array)
    g = ops.tensor(g, t.device)  # a leaf's hooks and .grad hold Tensors under either binding
    if t._hooks:
        for hook in tuple(t._hooks.values()):
            new = hook(g)
            if new is not None:
                g = new
        key = id(g)
        shared.add(key)  # a hook may have kept a reference to it
    if t.grad is not None:
        t.grad = g + t.grad if g.is_sparse else t.grad + g  # dense + sparse is sparse's to add
        return
    if create_graph or g.is_sparse:
        t.grad = g
    elif key in shared or g.array.base is not None:
        t.grad = _wrap(g.array.copy(), t.device)
    else:
        t.grad = g
        shared.add(key)
    ### END SOLUTION
    # Reached after a leaf's first .grad only (the code above returns when it added to one):
    # the modes hear of it, and the tracer binds the new .grad to the value it holds.
    for m in current_modes():
        m.fresh_grad(t, t.grad, g)

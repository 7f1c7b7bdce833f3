"""Jacobians and Hessians at width 512: ``minigrad.func`` vs ``torch.func``, same run, one thread.

The function is the pytorch/tutorials jacobians tutorial's ``predict``: ``tanh(linear(x, weight,
bias))`` with weight (D, D), bias (D,) and x (D,), differentiated with respect to x. ``jacrev`` is
``vmap`` of the vjp over the identity's D rows: one backward pass with a batch of D cotangents,
where a loop of D backward passes used to take minutes. ``hessian`` is ``jacfwd(jacrev)``: one more
batched pass, through the graph of the first, building the (D, D, D) result. Both frameworks run
the same calls on the same float32 inputs, in interleaved repeats, after the script has checked
that they agree. Targets (issue 28): jacrev <= 3x torch.func, hessian <= 5x.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_jacobian.py [--width D]
[--repeats R] [--steps N]``.
"""

from __future__ import annotations

import argparse

from common import conditions, interleaved_cases, table, torch  # first: sets BLAS threads (one) before numpy

import numpy

import minigrad
import minigrad.func
import minigrad.nn.functional as F

if torch is not None:
    import torch.func
    import torch.nn.functional

TARGETS = {"jacrev": 3.0, "hessian": 5.0}
CALLS = {"jacrev": 20, "hessian": 1}  # calls per timed step: a jacrev takes milliseconds, a hessian seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512, help="D: x has D features, weight is (D, D)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (median taken)")
    parser.add_argument("--steps", type=int, default=1, help="steps per repeat (20 jacrev calls or 1 hessian)")
    args = parser.parse_args()

    rng = numpy.random.default_rng(0)
    d = args.width
    arrays = (rng.standard_normal((d, d)).astype(numpy.float32) / numpy.sqrt(d),
              rng.standard_normal(d).astype(numpy.float32), rng.standard_normal(d).astype(numpy.float32))
    frameworks = {"minigrad": (minigrad, minigrad.func, F)}
    if torch is not None:
        frameworks["torch"] = (torch, torch.func, torch.nn.functional)

    runs: dict[str, dict] = {"jacrev": {}, "hessian": {}}
    results: dict[str, dict] = {"jacrev": {}, "hessian": {}}
    for name, (lib, func, nnf) in frameworks.items():
        weight, bias, x = (lib.tensor(a, dtype=lib.float32) for a in arrays)

        def predict(weight, bias, x, nnf=nnf):
            return nnf.linear(x, weight, bias).tanh()
        jac = func.jacrev(predict, argnums=2)
        hess = func.hessian(predict, argnums=2)
        for case, fn in (("jacrev", jac), ("hessian", hess)):
            results[case][name] = fn(weight, bias, x).numpy()  # warm up, and keep one result to compare
            runs[case][name] = lambda fn=fn, a=(weight, bias, x), n=CALLS[case]: [fn(*a) for _ in range(n)]
    if torch is not None:  # the same computation in both, or the comparison means nothing
        for case in runs:
            numpy.testing.assert_allclose(results[case]["minigrad"], results[case]["torch"], rtol=1e-3, atol=1e-4)

    ms = interleaved_cases(runs, args.repeats, args.steps)
    ms = {case: {who: t / CALLS[case] for who, t in times.items()} for case, times in ms.items()}
    print(f"bench_jacobian: the jacobians tutorial's predict, tanh(linear(x, W, b)) at D={d}, float32, "
          f"d/dx; jacrev ({d}x{d}) and hessian ({d}x{d}x{d})")
    print(f"median of {args.repeats} interleaved repeats x {args.steps} steps, ms per call; torch.func on 1 thread; "
          f"{conditions()}")
    print()
    print(table(ms, TARGETS))


if __name__ == "__main__":
    main()

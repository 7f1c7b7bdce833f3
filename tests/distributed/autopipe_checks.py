"""A pipeline cut automatically from the traced graph, checked on every rank: ``mpiexec -n N
python autopipe_checks.py`` (tests/test_partition.py launches it with N = 2 and 4).

Every rank builds the same model (a residual block, and the input read again by the last layer,
so values pass through the middle stages), traces it at the micro-batch's shape, and runs its own
stage of the plan with GPipe; its parameters' gradients and the output must equal one process's
full-batch step to 1e-5. Rank 0 prints "ok autopipe" and the plan's report.
"""

import numpy as np

import minigrad
import minigrad.distributed as dist
from minigrad import nn
from minigrad.graph import trace

dist.init_process_group("mpi")
RANK, N = dist.get_rank(), dist.get_world_size()
BATCH, M = 16, 4


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.a, self.b = nn.Linear(8, 32), nn.Linear(32, 32), nn.Linear(32, 32)
        self.c, self.out = nn.Linear(32, 64), nn.Linear(64, 4)

    def forward(self, x):
        h = self.inp(x).tanh()
        h = self.b(self.a(h).relu()) + h
        return self.out(self.c(h).relu()) + x[:, :4]


def build():
    minigrad.manual_seed(3)
    return Net()


rng = np.random.default_rng(5)
x = minigrad.tensor(rng.standard_normal((BATCH, 8)).astype(np.float32))
y = minigrad.tensor(rng.standard_normal((BATCH, 4)).astype(np.float32))

reference = build()
full = reference(x)
nn.MSELoss()(full, y).backward()
want = {name: p.grad.numpy() for name, p in reference.named_parameters()}

model = build()
micro = x[:BATCH // M]
stage, plan = dist.auto_pipeline_stage(trace(model, micro), [micro])
assert len(plan.stages) == N and all(s.nodes for s in plan.stages)
schedule = dist.ScheduleGPipe(stage, M, loss_fn=nn.MSELoss())
if RANK == 0:
    out = schedule.step(x)
elif RANK == N - 1:
    out = schedule.step(target=y)
else:
    out = schedule.step()

names = {id(p): name for name, p in model.named_parameters()}
mine = list(stage.submodule.parameters())  # a stage of parameter-free ops alone may hold none
for p in mine:
    np.testing.assert_allclose(p.grad.numpy(), want[names[id(p)]], rtol=1e-5, atol=1e-5)
for name, p in model.named_parameters():  # a parameter of another stage is left alone here
    assert (p.grad is None) == (id(p) not in {id(q) for q in mine}), name
if RANK == N - 1:
    np.testing.assert_allclose(out.numpy(), full.detach().numpy(), rtol=1e-5, atol=1e-5)

held = minigrad.tensor([float(len(mine))], dtype="float64")
counts = minigrad.zeros(N, dtype="float64")
dist.all_gather_into_tensor(counts, held)
assert int(counts.sum().item()) == len(want), counts  # every parameter lives on exactly one rank
dist.barrier()
if RANK == 0:
    print("ok autopipe", flush=True)
    print("cuts", plan.cuts, flush=True)
dist.destroy_process_group()

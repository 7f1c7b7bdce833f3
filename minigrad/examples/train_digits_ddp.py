"""Data-parallel training of the digits CNN: ``mpiexec -n 2 python -m minigrad.examples.train_digits_ddp``.

The same model and loop as ``train_digits``, on N processes (chapter 04): each rank reads its own
share of every epoch (``DistributedSampler``), ``DistributedDataParallel`` averages the gradients
during backward, and every rank takes the same optimizer step, so the ranks' weights never drift
apart; the script checks that at the end. Rank 0 prints the epoch's loss (averaged over ranks) and
the test accuracy, and saves the checkpoint. Needs ``pip install 'minigrad[mpi]'``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import minigrad
import minigrad.distributed as dist
from minigrad import nn, optim
from minigrad.data import DataLoader, Digits
from minigrad.examples.train_digits import evaluate, make_model


def train(epochs: int, batch_size: int, lr: float, seed: int, checkpoint: Path | None) -> float:
    """Train on this rank's shares with ``batch_size`` images per rank and step; returns the test
    accuracy (the same on every rank, since the weights are)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    minigrad.manual_seed(seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    train_set, test_set = Digits(train=True), Digits(train=False)
    model = dist.DistributedDataParallel(make_model())
    optimizer = optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    sampler = dist.DistributedSampler(train_set, seed=seed)
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    if rank == 0:
        print(f"{world} ranks x {batch_size} images per step ({world * batch_size} per step in all)")
    for epoch in range(epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        total = minigrad.zeros(2)  # (sum of losses, images) on this rank
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()  # DDP's hooks all-reduce the gradients bucket by bucket meanwhile
            optimizer.step()
            total += minigrad.tensor([loss.item() * len(y), len(y)])
        dist.all_reduce(total)  # the whole epoch's mean loss, over every rank's images
        accuracy = evaluate(model.module, test_set)
        if rank == 0:
            print(f"epoch {epoch + 1:2d}/{epochs}  loss {(total[0] / total[1]).item():.4f}  "
                  f"test accuracy {accuracy:.2%}")
            if checkpoint is not None:
                minigrad.save({"epoch": epoch, "model_state_dict": model.module.state_dict(),
                               "optimizer_state_dict": optimizer.state_dict()}, checkpoint)
    _check_identical(model.module)
    return accuracy


def _check_identical(model: nn.Module) -> None:
    """Raise on every rank unless every rank holds exactly rank 0's weights."""
    params = minigrad.cat([p.detach().reshape(-1) for p in model.parameters()])
    reference = params.clone()
    dist.broadcast(reference, src=0)
    differ = minigrad.tensor([float((params != reference).any().item())])
    dist.all_reduce(differ)
    if differ.item():
        raise RuntimeError(f"train_digits_ddp: the weights of {int(differ.item())} rank(s) differ from rank 0's")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16, help="images per rank and step")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", type=Path, default=None, help="where rank 0 saves (default: nowhere)")
    args = parser.parse_args(argv)
    dist.init_process_group("mpi")
    try:
        accuracy = train(args.epochs, args.batch_size, args.lr, args.seed, args.checkpoint)
        if dist.get_rank() == 0:
            print(f"final test accuracy {accuracy:.2%}; every rank holds the same weights")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Train a small CNN on the shipped 8x8 digits: the main job of a small minigrad project.

``python -m minigrad.examples.train_digits`` trains for ``--epochs`` with Adam and a one-cycle
schedule, shows a progress bar (tqdm, when installed), prints the test accuracy, and saves a
checkpoint with the epoch, model and optimizer state after every epoch. ``--resume`` continues
from that checkpoint; since each epoch's shuffle is seeded by (seed, epoch), a resumed run ends
with the same weights as an uninterrupted one. ``--device cuda`` trains on a GPU: the model is made
(with the same initial weights as on the cpu) and moved there, and every batch follows it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import minigrad
from minigrad import nn, optim
from minigrad.data import DataLoader, Digits

try:
    from tqdm import tqdm
except ImportError:  # tqdm comes with the dev extra; without it, one line per epoch
    tqdm = None


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 32 x 4 x 4
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 64 x 2 x 2
        nn.Flatten(), nn.Linear(256, 10),
    )


def evaluate(model: nn.Module, dataset: Digits) -> float:
    """Accuracy on the whole dataset, in one batch, on the model's device."""
    device = next(model.parameters()).device
    model.eval()
    with minigrad.no_grad():
        x = minigrad.tensor(dataset.data, device=device)
        y = minigrad.tensor(dataset.targets, device=device)
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    model.train()
    return accuracy


def train(epochs: int = 15, batch_size: int = 32, lr: float = 0.01, seed: int = 0,
          checkpoint: Path | None = None, resume: bool = False, progress: bool = True,
          device: str | minigrad.Device | None = None) -> float:
    """Train and return the test accuracy; ``device`` (default: the default device) is where the
    model trains."""
    device = minigrad.device(device) if device is not None else minigrad.get_default_device()
    minigrad.manual_seed(seed)
    train_set, test_set = Digits(train=True), Digits(train=False)
    with minigrad.device("cpu"):  # the same initial weights on every device: drawn by the cpu's generator
        model = make_model()
    model.to(device)
    optimizer = optim.Adam(model.parameters(), lr=lr)
    steps_per_epoch = -(-len(train_set) // batch_size)
    scheduler = optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, epochs=epochs, steps_per_epoch=steps_per_epoch)
    loss_fn = nn.CrossEntropyLoss()
    start = 0
    if resume:
        if checkpoint is None or not checkpoint.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {checkpoint}")
        state = minigrad.load(checkpoint)
        model.load_state_dict(state["model_state_dict"])
        optimizer.load_state_dict(state["optimizer_state_dict"])
        scheduler.load_state_dict(state["scheduler_state_dict"])
        start = state["epoch"] + 1
        print(f"resumed from {checkpoint} after epoch {state['epoch'] + 1}")

    for epoch in range(start, epochs):
        loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, generator=seed * 1000 + epoch)
        batches = tqdm(loader, desc=f"epoch {epoch + 1}/{epochs}", leave=False) if tqdm and progress else loader
        t0, total = time.perf_counter(), 0.0
        for x, y in batches:
            x, y = x.to(device), y.to(device)  # the loader's batches come on the cpu
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += loss.item() * len(y)
            if tqdm and progress:
                batches.set_postfix(loss=f"{loss.item():.3f}")
        accuracy = evaluate(model, test_set)
        print(f"epoch {epoch + 1:2d}/{epochs}  loss {total / len(train_set):.4f}  "
              f"test accuracy {accuracy:.2%}  ({time.perf_counter() - t0:.1f} s)")
        if checkpoint is not None:
            minigrad.save({"epoch": epoch, "model_state_dict": model.state_dict(),
                           "optimizer_state_dict": optimizer.state_dict(),
                           "scheduler_state_dict": scheduler.state_dict()}, checkpoint)
    return evaluate(model, test_set)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", type=Path, default=Path("digits_cnn.ckpt"))
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: the default device)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    accuracy = train(args.epochs, args.batch_size, args.lr, args.seed, args.checkpoint, args.resume,
                     not args.no_progress, args.device)
    print(f"final test accuracy {accuracy:.2%} in {time.perf_counter() - t0:.1f} s; checkpoint: {args.checkpoint}")


if __name__ == "__main__":
    main()

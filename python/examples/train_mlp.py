"""Train a small MLP with PyTorch and record it with poolsight; then print `poolsight report`.

    python python/examples/train_mlp.py [--device cpu|cuda] [--epochs 3] [--out train.pstrace]
                                        [--use-pool] [--stacks scopes|python]

On CPU (or CUDA without --use-pool) tensor storages are observed with poolsight.torch.track();
with --use-pool on CUDA, poolsight's pool is PyTorch's allocator and records every allocation.
Modules are link scopes and operators function scopes (poolsight.torch.hook).
"""

import argparse
import time

import torch

import poolsight
import poolsight.torch as pst


class MLP(torch.nn.Module):
    def __init__(self, features=64, hidden=256, classes=10):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(features, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, classes),
        )

    def forward(self, x):
        return self.net(x)


def synthetic(n, features, classes, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, features, generator=g) * 2
    labels = torch.randint(0, classes, (n,), generator=g)
    x = centers[labels] + torch.randn(n, features, generator=g)
    return x.to(device), labels.to(device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100, help="steps per epoch")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--out", default="train.pstrace")
    ap.add_argument("--use-pool", action="store_true", help="poolsight's pool as the allocator")
    ap.add_argument("--stacks", default="scopes", choices=["scopes", "python"])
    args = ap.parse_args()
    device = torch.device(args.device)

    with poolsight.record(args.out, stacks=args.stacks) as rec:
        if args.use_pool:
            pst.use_pool(device)
        torch.manual_seed(0)
        model = MLP().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x, y = synthetic(args.steps * args.batch, 64, 10, device)
        observer = pst.track(model, opt) if not args.use_pool else _nothing()
        start = time.perf_counter()
        with observer, pst.hook(model):
            for epoch in range(1, args.epochs + 1):
                with rec.epoch(epoch):
                    total = 0.0
                    for i in range(args.steps):
                        xb = x[i * args.batch : (i + 1) * args.batch]
                        yb = y[i * args.batch : (i + 1) * args.batch]
                        opt.zero_grad(set_to_none=True)
                        loss = torch.nn.functional.cross_entropy(model(xb), yb)
                        loss.backward()
                        opt.step()
                        total += loss.item()
                print(f"epoch {epoch}: loss {total / args.steps:.4f}")
        print(f"trained in {time.perf_counter() - start:.2f} s")
    poolsight.main(["report", args.out])


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()

"""stepcli's demo: a tiny MLP classifier trained on synthetic data with a DataLoader, on the CPU (or
CUDA).

Nothing in it knows about stepcli: it is the kind of unmodified script `stepcli run` is for.
"""

import argparse


def main() -> None:
    # The options are read before torch is imported: `stepcli demo -- --help` answers at once.
    parser = argparse.ArgumentParser(prog="stepcli demo [RUN OPTIONS] --", description=__doc__)
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW's learning rate")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], help="default: cuda where torch sees a GPU, else cpu"
    )
    args = parser.parse_args()

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    features = torch.randn(args.batch_size * args.iterations, 128)
    labels = (features[:, :10].sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(features, labels), batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(
        nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2)
    ).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    for iteration, (x, y) in enumerate(loader):
        x, y = x.to(args.device), y.to(args.device)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if iteration % 4 == 0:
            print(f"iteration {iteration:3d}  loss {loss.item():.4f}")


if __name__ == "__main__":
    main()

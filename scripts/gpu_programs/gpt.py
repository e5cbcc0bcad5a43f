"""Small GPT training loop with explicit attention matmuls, so every FLOP is a matmul torch counts.
Writes its own per-step wall times (synchronized) to --report, and the analytic matmul FLOPs per
step."""

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--layers", type=int, default=8)
p.add_argument("--d", type=int, default=1024)
p.add_argument("--heads", type=int, default=16)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--vocab", type=int, default=8192)
p.add_argument("--dtype", default="bf16")
p.add_argument("--slow-step", type=int, default=-1)
p.add_argument("--slow-s", type=float, default=0.5)
p.add_argument("--slow-every", type=int, default=0)
p.add_argument("--report", default=None)
p.add_argument("--own-profiler", action="store_true")
a = p.parse_args()
dev = "cuda" if torch.cuda.is_available() else "cpu"
if dev == "cpu":
    a.layers, a.d, a.heads, a.seq, a.batch, a.vocab = 2, 64, 4, 32, 2, 128
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


class Block(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.h = h
        s.ln1, s.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        s.qkv, s.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        s.fc1, s.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(s, x, mask):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v))
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(C // s.h)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(B, T, C)
        x = x + s.proj(y)
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x))))


class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = nn.Embedding(a.vocab, a.d)
        s.blocks = nn.ModuleList(Block(a.d, a.heads) for _ in range(a.layers))
        s.ln = nn.LayerNorm(a.d)
        s.head = nn.Linear(a.d, a.vocab, bias=False)

    def forward(s, idx):
        T = idx.shape[1]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=idx.device), 1)
        x = s.emb(idx)
        for b in s.blocks:
            x = b(x, mask)
        return s.head(s.ln(x))


model = GPT().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=(dev == "cuda"))
B, T, C, L, V = a.batch, a.seq, a.d, a.layers, a.vocab
tok = B * T
lin_params = L * (C * 3 * C + C * C + C * 4 * C + 4 * C * C) + C * V
attn_fwd = L * 4 * B * T * T * C
analytic = 6 * tok * lin_params + 3 * attn_fwd  # fwd 2*tok*P + bwd 4*tok*P; attention fwd + 2x bwd
amp = torch.autocast(dev, dtype=torch.bfloat16, enabled=(a.dtype == "bf16"))
times = []
prof = None
if a.own_profiler:
    prof = torch.profiler.profile(
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace("/tmp/own_trace.json"),
    )
    prof.start()
data = torch.randint(0, V, (B, T + 1), device=dev)
for step in range(a.steps):
    t0 = time.perf_counter()
    with amp:
        logits = model(data[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, V), data[:, 1:].reshape(-1))
    loss.backward()
    if step == a.slow_step or (
        a.slow_every and step >= 2 * a.slow_every and step % a.slow_every == 0
    ):
        time.sleep(a.slow_s)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if dev == "cuda":
        torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
    if prof is not None:
        prof.step()
print(f"loss {loss.item():.3f} median step {sorted(times)[len(times) // 2] * 1e3:.2f} ms")
if a.report:
    json.dump(
        {
            "times_s": times,
            "analytic_flops_per_step": analytic,
            "device": torch.cuda.get_device_name() if dev == "cuda" else None,
            "torch": torch.__version__,
            "params": sum(p.numel() for p in model.parameters()),
        },
        open(a.report, "w"),
    )

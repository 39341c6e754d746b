"""eager vs sdpa, per role, at two sequence lengths: step time and peak memory side by side.

    .venv/bin/python -m bench.bench_attention [--model builtin:tiny-llama] [--seq 128 512] [--batch 8]
                                              [--reps 5] [--out bench/results/attention.md]

What each role does, as the engine does it (``worker.engine``):

- actor: causal LM forward + backward (the PPO update's shape: logits -> a scalar loss);
- critic: value model (token classification, 1 label) forward + backward;
- reference: causal LM forward without gradients (``compute_ref_log_prob``);
- rollout: ``worker.engine.compute.generate`` with the KV cache, greedy, from a prompt of the sequence
  length, ``--new-tokens`` tokens.

Time: for each (role, length), eager and sdpa are loaded in one fresh process and their ``--reps``
repetitions alternate after one warm-up each, so a busy moment on a shared machine hits both alike; the
best repetition is the figure (median and worst are listed too). Memory: each (role, implementation,
length) runs one step in a fresh process, so its peak is its own: on CPU the growth of the peak resident
set (``ru_maxrss``) over the loaded model, on CUDA ``torch.cuda.max_memory_allocated`` after a reset.
The same weights (the preset's seeded ones, or the folder's)
serve every cell. The markdown
report records the machine, the date and the command.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py, whether run with -m or as a script
from common import machine, write_result

ROLES = ("actor", "critic", "reference", "rollout")
IMPLEMENTATIONS = ("eager", "sdpa")
ROOT = Path(__file__).resolve().parent.parent


def _rss_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _setup(folder: str, role: str, impl: str, seq: int, *, batch: int, new_tokens: int, device: str):
    """The role's model with ``impl`` and a ``step`` callable doing the role's work once."""
    import torch

    from worker.engine import models
    from worker.engine.compute import generate

    config = models.build_config(folder, {}, impl)
    loader = models.load_value_model if role == "critic" else models.load_causal_lm
    model = loader(folder, config).to(device)
    if role in ("reference", "rollout"):
        model.requires_grad_(False).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, config.vocab_size, (batch, seq), generator=gen).to(device)  # (B, T)
    mask = torch.ones_like(ids)  # (B, T)

    def step() -> None:
        if role in ("actor", "critic"):
            out = model(input_ids=ids, attention_mask=mask).logits.float()  # (B, T, V) or (B, T, 1)
            out.mean().backward()
            model.zero_grad(set_to_none=True)
        elif role == "reference":
            with torch.no_grad():
                model(input_ids=ids, attention_mask=mask)
        else:
            with torch.no_grad():
                generate(model, ids, mask, max_new_tokens=new_tokens, eos_token_id=None, pad_token_id=0,
                         temperature=1.0, top_p=1.0, do_sample=False, generator=None)
        if device == "cuda":
            torch.cuda.synchronize()

    return model, step


def time_pair(folder: str, role: str, seq: int, *, batch: int, reps: int, new_tokens: int, device: str,
              threads: int) -> dict[str, Any]:
    """Both implementations loaded in one process, repetitions alternated (eager, sdpa, eager, ...), so a
    busy moment on a shared machine hits both alike -> per implementation best, median and worst seconds."""
    import torch

    torch.set_num_threads(threads)
    steps = {impl: _setup(folder, role, impl, seq, batch=batch, new_tokens=new_tokens, device=device)
             for impl in IMPLEMENTATIONS}
    times: dict[str, list[float]] = {impl: [] for impl in IMPLEMENTATIONS}
    for impl in IMPLEMENTATIONS:
        steps[impl][1]()  # warm-up
    for _ in range(reps):
        for impl in IMPLEMENTATIONS:
            t0 = time.perf_counter()
            steps[impl][1]()
            times[impl].append(time.perf_counter() - t0)
    return {impl: {"min_s": min(t), "median_s": statistics.median(t), "max_s": max(t),
                   "observed": steps[impl][0].config._attn_implementation} for impl, t in times.items()}


def memory_cell(folder: str, role: str, impl: str, seq: int, *, batch: int, new_tokens: int, device: str,
                threads: int) -> float:
    """Peak memory of one step over the loaded model, MB (this process measures nothing else)."""
    import torch

    torch.set_num_threads(threads)
    _, step = _setup(folder, role, impl, seq, batch=batch, new_tokens=new_tokens, device=device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.max_memory_allocated() / 2**20
        step()
        return max(torch.cuda.max_memory_allocated() / 2**20 - base, 0.0)
    base = _rss_peak_mb()
    step()
    return max(_rss_peak_mb() - base, 0.0)


def _subprocess(args: argparse.Namespace, task: dict[str, Any]) -> Any:
    task = {**task, "batch": args.batch, "new_tokens": args.new_tokens, "device": args.device, "threads": args.threads}
    done = subprocess.run([sys.executable, "-m", "bench.bench_attention", "--cell", json.dumps(task)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{task} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, folder: str, role: str, seq: int) -> list[dict[str, Any]]:
    """One (role, length): the paired timing, then each implementation's memory in a fresh process."""
    timed = _subprocess(args, {"kind": "time", "folder": folder, "role": role, "seq": seq, "reps": args.reps})
    rows = []
    for impl in IMPLEMENTATIONS:
        peak = _subprocess(args, {"kind": "memory", "folder": folder, "role": role, "impl": impl, "seq": seq})
        t = timed[impl]
        tokens = args.batch * (args.new_tokens if role == "rollout" else seq)
        rows.append({"role": role, "impl": impl, "seq": seq, **t, "peak_mb": peak, "tokens_per_s": tokens / t["min_s"]})
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace, info: dict[str, Any], started: datetime) -> str:
    by = {(r["role"], r["impl"], r["seq"]): r for r in rows}
    lines = [
        "# Attention benchmark: eager vs sdpa per role",
        "",
        f"- date: {started.strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {info['host']}, {info['cpu']}, {info['cores']} cores"
        + (f", GPU {info['gpu']}" if info["gpu"] else ", no GPU")
        + (f" (1-minute load average {info['load_1min']:.1f} at the start: a shared machine)" if info["load_1min"] else ""),
        f"- software: Python {info['python']}, torch {info['torch']}, transformers {info['transformers']}",
        f"- model: {args.model}, fp32, device {args.device}, {args.threads} thread(s); batch {args.batch}; "
        f"{args.reps} repetitions after one warm-up, eager and sdpa alternated in one process; rollout generates "
        f"{args.new_tokens} tokens "
        f"from a prompt of the sequence length",
        f"- peak memory: growth of the {'peak allocated CUDA memory' if args.device == 'cuda' else 'peak resident set'}"
        " over the loaded model during one step, each in a fresh process",
        f"- command: `python -m bench.bench_attention --model {args.model} --seq {' '.join(map(str, args.seq))} "
        f"--batch {args.batch} --reps {args.reps} --new-tokens {args.new_tokens} --threads {args.threads}`",
        "",
        "| role | seq | eager time (best) | sdpa time (best) | eager / sdpa time | eager peak | sdpa peak "
        "| eager / sdpa memory |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for role in ROLES:
        for seq in args.seq:
            e, s = by[(role, "eager", seq)], by[(role, "sdpa", seq)]
            mem_ratio = f"{e['peak_mb'] / s['peak_mb']:.2f}x" if s["peak_mb"] > 0.5 else "n/a (below resolution)"
            lines.append(f"| {role} | {seq} | {e['min_s'] * 1000:.1f} ms | {s['min_s'] * 1000:.1f} ms | "
                         f"{e['min_s'] / s['min_s']:.2f}x | {e['peak_mb']:.1f} MB | {s['peak_mb']:.1f} MB | "
                         f"{mem_ratio} |")
    noisy = [r for r in rows if r["max_s"] > 2 * r["min_s"]]
    lines += ["", "A ratio above 1 means sdpa is faster (or lighter). Memory is deterministic (eager materialises the "
              "(B, heads, T, T) attention weights, sdpa does not), so its ratio grows with the sequence length."]
    if noisy:
        lines += ["", f"**Timing caveat:** in {len(noisy)} of {len(rows)} cells the worst repetition took more than twice "
                  "the best: other work on the machine dominated. Read the time ratios as indicative only; rerun on an "
                  "idle machine (or a GPU, `--device cuda`) for figures to rely on."]
    lines += ["", "Time is the best repetition (the least disturbed by other work on the machine); the spread over "
              "the repetitions (best / median / worst):", ""]
    for r in rows:
        lines.append(f"- {r['role']} {r['impl']} seq {r['seq']}: {r['min_s'] * 1000:.1f} / {r['median_s'] * 1000:.1f} / "
                     f"{r['max_s'] * 1000:.1f} ms, {r['tokens_per_s']:.0f} tokens/s at best, loaded as {r['observed']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny-llama", help="a built-in preset or a local HF model folder")
    parser.add_argument("--seq", type=int, nargs=2, default=[128, 512], help="the two sequence lengths")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per rollout")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "attention.md")
    parser.add_argument("--cell", help=argparse.SUPPRESS)  # internal: one cell, JSON in, JSON out
    args = parser.parse_args(argv)

    if args.cell:  # internal: one measurement in this fresh process
        task = json.loads(args.cell)
        common = {k: task[k] for k in ("batch", "new_tokens", "device", "threads")}
        if task["kind"] == "time":
            out: Any = time_pair(task["folder"], task["role"], task["seq"], reps=task["reps"], **common)
        else:
            out = memory_cell(task["folder"], task["role"], task["impl"], task["seq"], **common)
        print(json.dumps(out))
        return 0

    from worker.engine import models

    started = datetime.now(UTC)
    info = machine()
    with tempfile.TemporaryDirectory() as cache:
        folder = str(models.resolve_model_path(args.model, [Path(args.model).parent] if not models.is_builtin(args.model)
                                               else [], cache_dir=cache))
        rows = []
        for role in ROLES:
            for seq in args.seq:
                e, s = measure(args, folder, role, seq)
                rows += [e, s]
                print(f"{role:9s} seq {seq:4d}: eager {e['min_s'] * 1000:8.1f} ms {e['peak_mb']:7.1f} MB | "
                      f"sdpa {s['min_s'] * 1000:8.1f} ms {s['peak_mb']:7.1f} MB | time ratio "
                      f"{e['min_s'] / s['min_s']:.2f}x, memory ratio "
                      f"{(e['peak_mb'] / s['peak_mb']) if s['peak_mb'] > 0.5 else float('nan'):.2f}x", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, report(rows, args, info, started))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The device check: what each attention implementation really runs on one accelerator, and what it costs.

    bench/device_check.sh                                     # = python3 bench/device_check.py --device cuda
    python bench/device_check.py --device cuda                # one GPU: Qwen2.5-0.5B shape, seq 512 and 4096
    python bench/device_check.py --device cpu --out /tmp/device.md   # the suite's smoke form (tiny shape)

Per implementation (eager, sdpa, and flash_attention_2 / flash_attention_3 where a flash-attn build is
importable), the engine's own rank code (``worker.engine.rank.RankWorker``, driven in this process at
world 1: a gloo or nccl process group of one rank, no Ray) loads the actor, reference and critic of a
Qwen2.5-0.5B-shaped model with random weights (built in code: no download) in bf16 compute over fp32
master weights, as verl's defaults say. It records per role the implementation the first forward called
and the SDPA backend below it (and why, where it was math), checks the actor's logits against eager's on
the same weights, then runs ``--steps`` PPO steps (gae: rollout, log-probs, reference, values, GAE, critic
and actor updates) at each sequence length and reports tokens/s and peak memory. It writes a markdown
report (``bench/results/device.md`` by default) with the machine's description, after every measured
unit, so a run cut short still leaves what it measured; units that would start after ``--budget-s``
seconds are listed as skipped.

Needs only torch and transformers (the device machine has neither Ray nor pydantic): it imports the
rank code, the PPO math and the probe, none of which import either.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the repository's worker package, run as a script or with -m
sys.path.insert(0, str(ROOT / "bench"))
from common import write_result

IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3")
ROLES = ("actor", "rollout", "reference", "critic")


@dataclass(frozen=True)
class Preset:
    """A model shape (random weights) and the work per step at each sequence length."""

    config: dict[str, Any]
    seqs: tuple[int, ...]
    response: int  # generated tokens per row; the prompt is the rest of the sequence
    tokens_per_step: int  # rows per step = tokens_per_step // seq (at least 1)
    tokens_per_micro: int  # rows per micro-batch of the updates = tokens_per_micro // seq (at least 1)
    description: str


PRESETS = {
    "qwen2.5-0.5b": Preset(
        config={"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                    "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
                    "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "use_sliding_window": False},
        seqs=(512, 4096), response=64, tokens_per_step=8192, tokens_per_micro=4096,
        description="Qwen2.5-0.5B shape, random weights (hidden 896, 24 layers, 14 heads / 2 kv heads, "
                    "intermediate 4864, vocab 151936, tied embeddings)"),
    "tiny": Preset(
        config={"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
                    "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "use_sliding_window": False},
        seqs=(32, 64), response=8, tokens_per_step=128, tokens_per_micro=64,
        description="tiny Qwen2 shape, random weights (hidden 64, 2 layers, 4 heads / 2 kv heads, vocab 256)"),
}


@dataclass
class Unit:
    """One implementation at one sequence length."""

    implementation: str
    seq: int
    rows: int = 0
    status: str = "pending"  # ok | failed | skipped
    reason: str = ""
    step_times: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    peak_memory_mb: float | None = None


@dataclass
class Column:
    """One implementation: how each role loaded and what ran, parity with eager, its units."""

    implementation: str
    status: str = "pending"
    reason: str = ""
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)
    parity: float | None = None
    attention_ops: list[str] = field(default_factory=list)
    units: list[Unit] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Set-up


def available(implementation: str, device: str) -> str | None:
    """Why ``implementation`` cannot run here, or None. FlashAttention needs CUDA and an importable build
    (transformers' own availability checks)."""
    if implementation in ("eager", "sdpa"):
        return None
    if device != "cuda":
        return f"{implementation} runs on CUDA only"
    from transformers import utils as hf_utils

    check = {"flash_attention_2": "is_flash_attn_2_available", "flash_attention_3": "is_flash_attn_3_available"}
    fn = getattr(hf_utils, check.get(implementation, ""), None)
    if fn is not None:
        return None if fn() else f"no importable build for {implementation} (transformers.utils.{check[implementation]}())"
    module = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}.get(implementation)
    if module and importlib.util.find_spec(module) is None:
        return f"{module} is not importable"
    return None


def build_model_folder(preset: Preset, folder: Path, device: str, seed: int) -> Path:
    """A Qwen2 causal LM of the preset's shape with seeded random weights, saved as an HF folder (bf16 on disk)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**preset.config)
    torch.manual_seed(seed)
    with torch.device(device):  # random init on the device: seconds instead of a minute on the host
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    return folder


def role_plans(folder: str, implementation: str, *, compute_dtype: str, master_dtype: str,
               checkpointing: bool) -> list[Any]:
    """Actor, reference and critic as the engine's plan gives them (strict: only ``implementation``)."""
    from worker.engine.rank import RolePlan

    def plan(role: str, loader: str, trained: bool, lr: float) -> RolePlan:
        return RolePlan(role=role, loader=loader, folder=folder, override_config={}, candidates=[implementation],
                        requested=implementation, forced=False, reasons=[], strategy="fsdp2", sp=1, trained=trained,
                        lr=lr, weight_decay=0.0, gradient_checkpointing=checkpointing and trained,
                        compute_dtype=compute_dtype, master_dtype=master_dtype)

    return [plan("actor", "causal_lm", True, 1e-6), plan("reference", "causal_lm", False, 1e-6),
            plan("critic", "value", True, 1e-5)]


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _peak_mb(device: str) -> float:
    import resource

    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB; a process-wide peak on CPU


def _reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


# --------------------------------------------------------------------------------------------
# One implementation


def parity_logits(worker: Any, vocab: int, seq: int, device: str, compute_dtype: str) -> tuple[Any, list[str]]:
    """The actor's logits (fp32, on the host) on a fixed batch of 2 x ``seq`` random ids, in the role's
    compute dtype, before any update; and the attention-related op names one such forward dispatched
    (what the implementation runs below its name: flash_attn::*, aten::_scaled_dot_product_*, bmm+softmax)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from worker.engine import compute

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (2, seq), generator=gen).to(device)  # (2, seq)
    model = worker.roles["actor"].module
    model.eval()
    with torch.no_grad(), compute.autocast(ids.device.type, compute_dtype):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            logits = model(input_ids=ids, use_cache=False).logits
        logits = logits.float().cpu()  # (2, seq, V)
    names = sorted({e.name for e in prof.events()
                    if any(k in e.name.lower() for k in ("attention", "flash", "sdpa", "softmax"))})
    return logits, names


def ppo_step(worker: Any, *, rows: int, seq: int, response: int, micro_rows: int, vocab: int, device: str,
             step: int, compute_dtype: str) -> float:
    """One gae PPO step through the rank's own methods -> its wall time (device synchronised)."""
    import torch

    from worker.engine import compute
    from worker.ppo import advantage

    prompt = seq - response
    gen = torch.Generator().manual_seed(100 + step)
    prompt_ids = torch.randint(1, vocab, (rows, prompt), generator=gen)  # (N, P)
    prompt_mask = torch.ones(rows, prompt, dtype=torch.long)  # (N, P)
    _sync(device)
    t0 = time.perf_counter()
    out = worker.generate({"prompt_ids": prompt_ids, "prompt_mask": prompt_mask},
                          {"max_new_tokens": response, "eos_token_id": None, "pad_token_id": 0, "temperature": 1.0,
                           "top_p": 1.0, "do_sample": True, "seed": step, "dtype": compute_dtype})
    batch = {**compute.assemble(prompt_ids, prompt_mask, out["responses"], out["response_mask"]),
             "responses": out["responses"], "response_mask": out["response_mask"]}  # (N, P + R)
    mask = batch["response_mask"].float()  # (N, R)
    batch["old_log_probs"] = worker.compute_log_prob(batch, 1.0)["old_log_probs"]
    batch["ref_log_prob"] = worker.compute_ref_log_prob(batch, 1.0)["ref_log_prob"]
    batch["values"] = worker.compute_values(batch)["values"]
    # A rule on the token ids (a random model has no tokenizer): the share of even ids, on the last token.
    scores = torch.zeros_like(mask)  # (N, R)
    scores[:, -1] = (out["responses"] % 2 == 0).float().mean(dim=-1)
    batch["advantages"], batch["returns"] = advantage.compute_gae_advantage_return(scores, batch["values"], mask,
                                                                                   1.0, 1.0)
    worker.update_critic(batch, compute.CriticSettings(ppo_epochs=1, mini_batch=rows, micro_batch=micro_rows,
                                                       cliprange_value=0.5, grad_clip=1.0))
    worker.update_actor(batch, compute.ActorSettings(ppo_epochs=1, mini_batch=rows, micro_batch=micro_rows,
                                                     clip_ratio=0.2, entropy_coeff=0.0, use_kl_loss=False,
                                                     kl_loss_coef=0.001, kl_loss_type="low_var_kl", grad_clip=1.0,
                                                     temperature=1.0))
    _sync(device)
    return time.perf_counter() - t0


def check_implementation(column: Column, *, folder: Path, preset: Preset, args: argparse.Namespace, env: dict,
                         reference_logits: dict[int, Any], deadline: float, on_progress) -> None:
    """Load the three roles with one implementation, observe, check parity, run the steps per sequence length."""
    from worker.engine.rank import LoadPlan, RankWorker, RoleLoadError

    impl, device = column.implementation, args.device
    worker = RankWorker(rank=0, world=1, run_id="device-check", device=device)
    plans = role_plans(str(folder), impl, compute_dtype=args.compute_dtype, master_dtype=args.master_dtype,
                       checkpointing=not args.no_checkpointing)
    try:
        reports = worker.load(LoadPlan(roles=plans, policy="strict", env=env, seed=args.seed))
    except RoleLoadError as exc:
        column.status, column.reason = "failed", f"[{exc.role}] {exc.attempts[-1]['error']}"
        return
    for report in reports:
        column.roles[report["role"]] = report
    vocab = preset.config["vocab_size"]
    parity_seq = min(preset.seqs)
    logits, column.attention_ops = parity_logits(worker, vocab, parity_seq, device, args.compute_dtype)
    if impl == "eager":
        reference_logits[parity_seq] = logits
    if parity_seq in reference_logits:
        column.parity = float((logits - reference_logits[parity_seq]).abs().max())
    del logits
    column.status = "ok"
    for unit in column.units:
        if time.monotonic() > deadline:
            unit.status, unit.reason = "skipped", f"the {args.budget_s:.0f} s budget was spent"
            continue
        unit.rows = max(1, preset.tokens_per_step // unit.seq)
        micro = max(1, min(unit.rows, preset.tokens_per_micro // unit.seq))
        _reset_peak(device)
        try:
            for step in range(1, args.steps + 1):
                unit.step_times.append(ppo_step(worker, rows=unit.rows, seq=unit.seq, response=preset.response,
                                                micro_rows=micro, vocab=vocab, device=device, step=step,
                                                compute_dtype=args.compute_dtype))
        except Exception as exc:
            unit.status, unit.reason = "failed", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
            traceback.print_exc()
            _free(device)
            on_progress()
            continue
        measured = unit.step_times[1:] or unit.step_times  # the first step warms up (allocator, kernels)
        unit.tokens_per_s = unit.rows * unit.seq / (sum(measured) / len(measured))
        unit.peak_memory_mb = _peak_mb(device)
        unit.status = "ok"
        on_progress()
    if "rollout" not in column.roles and worker.rollout_report is not None:
        column.roles["rollout"] = worker.rollout_report
    del worker


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------
# Report


def planned_flops(preset: Preset, steps: int, implementations: int) -> float:
    """Rough work of the whole check: ~12 forward-equivalents per token and step (rollout, log-probs,
    reference, values: 1 each; critic and actor updates: forward + backward + checkpoint recompute, 4
    each), 2 FLOPs per weight and token, plus causal attention (2 * 2 * L * d per layer, halved)."""
    c = preset.config
    d, layers, vocab, inter = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    kv = d * c["num_key_value_heads"] // c["num_attention_heads"]
    weights = layers * (2 * d * d + 2 * d * kv + 3 * d * inter) + d * vocab  # attention, MLP, LM head
    total = 0.0
    for seq in preset.seqs:
        tokens = max(1, preset.tokens_per_step // seq) * seq
        per_token = 2 * weights + 2 * layers * d * seq
        total += 12 * per_token * tokens * steps
    return total * implementations


def _mb(x: float | None) -> str:
    return "—" if x is None else f"{x:,.0f} MB"


def render(columns: list[Column], *, probe: dict, preset_name: str, preset: Preset, args: argparse.Namespace,
           started: float, finished: bool) -> str:
    gpu = probe.get("gpu_name") or "no GPU"
    cc = probe.get("compute_capability")
    lines = [
        "# Device check: attention implementations on one device",
        "",
        f"- date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {'finished' if finished else 'in progress'} "
        f"after {time.monotonic() - started:.0f} s",
        f"- machine: {probe.get('hostname')}, device {probe['device']}, {gpu}"
        + (f" (sm{cc[0]}{cc[1]})" if cc else "") + f", {os.cpu_count()} CPU cores",
        f"- software: torch {probe.get('torch_version')}, CUDA {probe.get('cuda_version') or '—'}, driver "
        f"{probe.get('driver_version') or '—'}, transformers {probe.get('transformers_version')}, flash-attn "
        f"{probe.get('flash_attn_version') or 'not installed'}, flash-attn 3 "
        f"{probe.get('flash_attn_3_version') or 'not installed'}, kernels {probe.get('kernels_version') or 'not installed'}",
        f"- SDPA backends that run here: {', '.join(probe.get('sdpa_backends') or []) or '—'}"
        + "".join(f"; {name} refused ({c.get('error', 'switched off').split('. ')[0]})"
                  for name, c in (probe.get("sdpa_backend_checks") or {}).items()
                  if not (c.get("enabled") and c.get("runs"))),
        f"- model: {preset.description}; {args.compute_dtype} compute over {args.master_dtype} master weights "
        f"(the reference holds its weights in {args.compute_dtype}); FSDP2 at world 1 "
        f"({'nccl' if args.device == 'cuda' else 'gloo'}), gradient checkpointing "
        f"{'off' if args.no_checkpointing else 'on'} for the trained roles",
        f"- work: gae, {args.steps} PPO steps per implementation and sequence length; a step's rows = "
        f"{preset.tokens_per_step} tokens / sequence length, each generating {preset.response} tokens after a "
        f"prompt of the rest; updates in micro-batches of {preset.tokens_per_micro} tokens; tokens/s over the "
        f"steps after the first (a warm-up)",
        f"- command: `python bench/device_check.py {' '.join(sys.argv[1:])}`",
        "",
        "## What ran, per role",
        "",
        "| implementation | role | loaded | observed (calls) | SDPA backend | why math | compute / weights |",
        "|---|---|---|---|---|---|---|",
    ]
    for col in columns:
        if col.status in ("skipped", "failed") and not col.roles:
            lines.append(f"| {col.implementation} | all | {col.status} | — | — | {col.reason} | — |")
            continue
        for role in ROLES:
            r = col.roles.get(role)
            if r is None:
                continue
            calls = ", ".join(f"{k} ×{v}" for k, v in (r.get("calls") or {}).items())
            backend = r.get("sdpa_backend") or "—"
            ops = [rec.get("op") for rec in r.get("sdpa") or [] if rec.get("op")]
            if ops:
                backend += f" (`{ops[0]}`)"
            lines.append(f"| {col.implementation} | {role} | {r.get('effective')} | {r.get('observed')} ({calls}) | "
                         f"{backend} | {r.get('sdpa_backend_reason') or '—'} | "
                         f"{r.get('compute_dtype')} / {r.get('weights_dtype')} |")
    lines += ["", "## Throughput and peak memory", "",
              "| implementation | seq | rows | step times | tokens/s | peak memory | status |",
              "|---|---:|---:|---|---:|---:|---|"]
    for col in columns:
        for unit in col.units:
            times = ", ".join(f"{t:.2f} s" for t in unit.step_times) or "—"
            tps = "—" if unit.tokens_per_s is None else f"{unit.tokens_per_s:,.0f}"
            status = unit.status + (f": {unit.reason}" if unit.reason else "")
            lines.append(f"| {col.implementation} | {unit.seq} | {unit.rows or '—'} | {times} | {tps} | "
                         f"{_mb(unit.peak_memory_mb)} | {status} |")
    parity_seq = min(preset.seqs)
    lines += ["", f"## Parity with eager (same weights, 2 x {parity_seq} random ids, {args.compute_dtype})", "",
              "| implementation | max abs logit difference from eager | attention ops one forward dispatched |",
              "|---|---:|---|"]
    for col in columns:
        if col.status != "ok":
            continue
        parity = "—" if col.parity is None else f"{col.parity:.3g}"
        ops = ", ".join(f"`{o}`" for o in col.attention_ops) or "—"
        lines.append(f"| {col.implementation} | {parity} | {ops} |")
    peak = ("torch.cuda.max_memory_allocated after a reset per sequence length" if args.device == "cuda"
            else "the process peak resident set (ru_maxrss), which only grows")
    lines += ["", f"Peak memory: {peak}. "
              f"In {args.compute_dtype} two implementations differ by rounding (~1e-2 on logits of this size); "
              f"eager is the reference."]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None,
                        help="model shape and work (default: qwen2.5-0.5b on cuda, tiny on cpu)")
    parser.add_argument("--implementations", nargs="+", default=list(IMPLEMENTATIONS),
                        help="eager first: the parity reference")
    parser.add_argument("--seqs", nargs="+", type=int, default=None, help="sequence lengths (default: the preset's)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--response", type=int, default=None, help="generated tokens per row (default: the preset's)")
    parser.add_argument("--tokens-per-step", type=int, default=None, help="rows per step x sequence length")
    parser.add_argument("--tokens-per-micro", type=int, default=None, help="rows per update micro-batch x length")
    parser.add_argument("--compute-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--master-dtype", default="float32", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--no-checkpointing", action="store_true", help="turn gradient checkpointing off")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start no unit after this many seconds (the report lists the rest as skipped)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads on CPU")
    parser.add_argument("--out", type=Path, default=None,
                        help="the report (default: bench/results/device.md on cuda, device_cpu.md on cpu)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = ROOT / "bench" / "results" / ("device.md" if args.device == "cuda" else "device_cpu.md")
    if args.steps < 1:
        parser.error(f"--steps: {args.steps} must be at least 1")
    unknown = [i for i in args.implementations if i not in IMPLEMENTATIONS]
    if unknown:
        parser.error(f"--implementations: {unknown[0]!r} is not checked here; valid: {', '.join(IMPLEMENTATIONS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device here; use --device cpu", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    preset_name = args.preset or ("qwen2.5-0.5b" if args.device == "cuda" else "tiny")
    preset = PRESETS[preset_name]
    overrides = {"seqs": tuple(args.seqs) if args.seqs else None, "response": args.response,
                 "tokens_per_step": args.tokens_per_step, "tokens_per_micro": args.tokens_per_micro}
    preset = Preset(**{**preset.__dict__, **{k: v for k, v in overrides.items() if v is not None}})
    if any(seq <= preset.response for seq in preset.seqs):
        print(f"--seqs: every length must exceed the {preset.response} generated tokens", file=sys.stderr)
        return 2

    from worker.core.environment import Environment
    from worker.engine.probe import environment_fields, probe_environment
    from worker.engine.rank import RankWorker, free_port

    probe = probe_environment()
    env = Environment.from_dict(environment_fields(probe)).to_dict()
    impls = list(dict.fromkeys(args.implementations))
    print(f"device check: {preset_name} on {args.device}; planned work about "
          f"{planned_flops(preset, args.steps, len(impls)) / 1e15:.2f} PFLOP", flush=True)
    RankWorker(rank=0, world=1, run_id="device-check", device=args.device).init_process_group(
        "127.0.0.1", free_port(), [1])  # the process group every RankWorker of this process then shares
    columns = [Column(i, units=[Unit(i, seq) for seq in preset.seqs]) for i in impls]
    deadline = started + args.budget_s

    def progress(finished: bool = False) -> None:
        write_result(args.out, render(columns, probe=probe, preset_name=preset_name, preset=preset, args=args,
                                      started=started, finished=finished))

    reference_logits: dict[int, Any] = {}
    with tempfile.TemporaryDirectory(prefix="attnboard-device-check-") as tmp:
        folder = build_model_folder(preset, Path(tmp) / preset_name, args.device, args.seed)
        for column in columns:
            why = available(column.implementation, args.device)
            if why is None and time.monotonic() > deadline:
                why = f"the {args.budget_s:.0f} s budget was spent"
            if why is not None:
                column.status, column.reason = "skipped", why
                for unit in column.units:
                    unit.status, unit.reason = "skipped", why
                progress()
                continue
            print(f"-- {column.implementation}", flush=True)
            try:
                check_implementation(column, folder=folder, preset=preset, args=args, env=env,
                                     reference_logits=reference_logits, deadline=deadline, on_progress=progress)
            except Exception as exc:
                column.status, column.reason = "failed", f"{type(exc).__name__}: {exc}"
                traceback.print_exc()
            _free(args.device)
            progress()
    progress(finished=True)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    failed = [c.implementation for c in columns if c.status == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

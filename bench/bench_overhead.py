"""Overhead: one PPO step of the engine against the sum of its isolated passes in plain torch, same shapes.

    .venv/bin/python bench/bench_overhead.py [--steps 8] [--response-length 16]
                                             [--out bench/results/overhead.md]

The problem is tiny_problem.py's (bench_trl.py's before issue 20): ``builtin:tiny-llama``, fp32, sdpa, CPU,
one torch thread; 32 sequences a step (8 ``builtin:count`` prompts x 4 samples, prompts of 14 tokens),
``--response-length`` sampled tokens;
1 PPO epoch, 1 mini-batch of 32, micro-batches of 2, AdamW.

Four things are timed step by step in turn in one run: an engine step, then (inside the engine's metric
callback, outside its step time) one step of each in-process variant, then the next engine step, ...:

- engine: ``run_spec`` with ``trainer.n_gpus_per_node=1`` (one Ray rank actor; at a world of 1 the engine
  leaves its models unwrapped, ``RankWorker._shard``);
  a step runs from the return of the previous metric callback to the next metric event;
- plain torch, each part timed on its own and summed: a sampling loop with the HF model's KV cache
  (``--response-length`` tokens, softmax + multinomial), one no-grad forward over the 32 whole sequences
  each for the old log-probs (actor), the reference log-probs and the values (critic), and per trained
  model 16 micro-batch forward+backward passes of the clipped PPO loss followed by one AdamW step;
- in-process: the engine's own compute functions (``worker.engine.compute``: ``generate``,
  ``policy_forward``, ``value_forward``, ``update_actor``, ``update_critic``) on the same plain modules, then
  on modules wrapped with FSDP2 over a world of 1 (the engine's layout at a world > 1), in this process, no
  Ray. They split the overhead into factors: the compute code over plain torch, and Ray dispatch plus the
  controller's own work (rule reward, GAE, metrics, events) over the in-process compute code; the FSDP2
  column shows what wrapping would cost (the engine skips it at a world of 1).

The first step of each is a warm-up and dropped. ratio = engine step time / sum of the plain parts (medians;
the median of the per-turn ratios is given too). Target: at most 1.25x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: the sibling bench module
from common import load_text, local_ray, write_result
from tiny_problem import LR, MAX_PROMPT, MICRO, PROMPTS, ROWS, SAMPLES, TASK, Side, run_attnboard, start_problem

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("generate", "log-probs (old, ref, values)", "actor update", "critic update")
CLIP = 0.2


def fsdp2_world_1(module: torch.nn.Module) -> torch.nn.Module:
    """The engine's FSDP2 layout (``RankWorker._shard``: each decoder layer, then the root) over a world of 1."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (1,))
    for layer in module.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module


class Models:
    """Fresh HF modules from the preset folder: actor (trained), reference, critic (trained); plain, or
    wrapped as the engine wraps them (``fsdp=True``, needs a process group)."""

    def __init__(self, folder: Path, *, fsdp: bool = False):
        from worker.engine import models

        wrap = fsdp2_world_1 if fsdp else (lambda module: module)
        self.actor = wrap(models.load_causal_lm(folder, models.build_config(folder, {}, "sdpa")))
        self.ref = wrap(models.load_causal_lm(folder, models.build_config(folder, {}, "sdpa")).requires_grad_(False).eval())
        self.critic = wrap(models.load_value_model(folder, models.build_config(folder, {}, "sdpa")))
        self.actor_opt = torch.optim.AdamW(self.actor.parameters(), lr=LR, weight_decay=0.0)
        self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=LR, weight_decay=0.0)


def prompt_batch(folder: Path) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """The engine's first batch shape: 8 prompts x 4 samples, left-padded -> ids, mask (N, P), eos, pad."""
    from worker.engine import models
    from worker.ppo import data

    tok = models.load_tokenizer(folder)
    rows = data.load_prompts(TASK, tok, MAX_PROMPT, seed=0)[:PROMPTS]
    p = max(len(r.prompt_ids) for r in rows)
    ids = torch.full((PROMPTS, p), tok.pad_token_id, dtype=torch.long)  # (B, P)
    mask = torch.zeros(PROMPTS, p, dtype=torch.long)  # (B, P)
    for i, row in enumerate(rows):
        ids[i, p - len(row.prompt_ids):] = torch.tensor(row.prompt_ids)
        mask[i, p - len(row.prompt_ids):] = 1
    return ids.repeat_interleave(SAMPLES, 0), mask.repeat_interleave(SAMPLES, 0), tok.eos_token_id, tok.pad_token_id


# ---------------------------------------------------------------------------------------------
# Plain torch


@torch.no_grad()
def plain_generate(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int,
                   generator: torch.Generator) -> torch.Tensor:
    """Sample ``new_tokens`` tokens with the KV cache: (N, P) -> responses (N, R)."""
    model.eval()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # (N, P)
    inputs, cache, tokens = ids, None, []
    for _ in range(new_tokens):
        out = model(input_ids=inputs, attention_mask=mask, position_ids=position_ids, cache=cache, use_cache=True)
        cache = out.cache
        probs = torch.softmax(out.logits[:, -1, :], dim=-1)  # (N, V)
        token = torch.multinomial(probs, 1, generator=generator)  # (N, 1)
        tokens.append(token)
        inputs = token
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)  # (N, P + t + 1)
        position_ids = position_ids[:, -1:] + 1  # (N, 1)
    return torch.cat(tokens, dim=1)  # (N, R)


def plain_log_probs(model: torch.nn.Module, seq: torch.Tensor, mask: torch.Tensor, r: int) -> torch.Tensor:
    """(N, P + R) -> log-probs (N, R) of the response tokens."""
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # (N, L)
    logits = model(input_ids=seq, attention_mask=mask, position_ids=position_ids).logits[:, -r - 1:-1]  # (N, R, V)
    return torch.log_softmax(logits, dim=-1).gather(-1, seq[:, -r:, None]).squeeze(-1)  # (N, R)


def plain_values(model: torch.nn.Module, seq: torch.Tensor, mask: torch.Tensor, r: int) -> torch.Tensor:
    """(N, P + R) -> values (N, R) of the states before each response token."""
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # (N, L)
    return model(input_ids=seq, attention_mask=mask, position_ids=position_ids).logits[:, -r - 1:-1, 0]  # (N, R)


def plain_step(m: Models, ids: torch.Tensor, mask: torch.Tensor, r: int, generator: torch.Generator) -> dict[str, float]:
    """One PPO step's passes in plain torch -> seconds per part."""
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    responses = plain_generate(m.actor, ids, mask, r, generator)  # (N, R)
    times[PARTS[0]] = time.perf_counter() - t0

    t0 = time.perf_counter()
    seq = torch.cat([ids, responses], dim=1)  # (N, P + R)
    full_mask = torch.cat([mask, torch.ones_like(responses)], dim=1)  # (N, P + R)
    with torch.no_grad():
        old = plain_log_probs(m.actor, seq, full_mask, r)  # (N, R)
        plain_log_probs(m.ref, seq, full_mask, r)
        m.critic.eval()
        values = plain_values(m.critic, seq, full_mask, r)  # (N, R)
    times[PARTS[1]] = time.perf_counter() - t0
    advantages = torch.randn_like(old)  # (N, R) the update's cost does not depend on their values
    returns = values + torch.randn_like(values)  # (N, R)

    t0 = time.perf_counter()
    m.actor.train()
    m.actor_opt.zero_grad(set_to_none=True)
    for s in range(0, ROWS, MICRO):
        sl = slice(s, s + MICRO)
        logp = plain_log_probs(m.actor, seq[sl], full_mask[sl], r)  # (n, R)
        ratio = torch.exp(logp - old[sl])
        pg_loss = torch.max(-advantages[sl] * ratio, -advantages[sl] * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
        (pg_loss * MICRO / ROWS).backward()
    m.actor_opt.step()
    times[PARTS[2]] = time.perf_counter() - t0

    t0 = time.perf_counter()
    m.critic.train()
    m.critic_opt.zero_grad(set_to_none=True)
    for s in range(0, ROWS, MICRO):
        sl = slice(s, s + MICRO)
        vpred = plain_values(m.critic, seq[sl], full_mask[sl], r)  # (n, R)
        clipped = values[sl] + (vpred - values[sl]).clamp(-0.5, 0.5)
        vf_loss = 0.5 * torch.max((vpred - returns[sl]) ** 2, (clipped - returns[sl]) ** 2).mean()
        (vf_loss * MICRO / ROWS).backward()
    m.critic_opt.step()
    times[PARTS[3]] = time.perf_counter() - t0
    return times


# ---------------------------------------------------------------------------------------------
# The engine's compute functions, in this process, on the same plain modules


def inprocess_step(m: Models, ids: torch.Tensor, mask: torch.Tensor, r: int, eos: int, pad: int,
                   generator: torch.Generator) -> dict[str, float]:
    from worker.engine import compute
    from worker.ppo import advantage

    times: dict[str, float] = {}
    t0 = time.perf_counter()
    m.actor.eval()
    gen = compute.generate(m.actor, ids, mask, max_new_tokens=r, eos_token_id=eos, pad_token_id=pad, temperature=1.0,
                           top_p=1.0, do_sample=True, generator=generator)
    times[PARTS[0]] = time.perf_counter() - t0

    t0 = time.perf_counter()
    batch = {**compute.assemble(ids, mask, gen["responses"], gen["response_mask"]),
             "responses": gen["responses"], "response_mask": gen["response_mask"]}
    with torch.no_grad():
        batch["old_log_probs"], _ = compute.policy_forward(m.actor, batch, compute.NO_SP, temperature=1.0,
                                                           with_entropy=True)
        batch["ref_log_prob"], _ = compute.policy_forward(m.ref, batch, compute.NO_SP, temperature=1.0,
                                                          with_entropy=False)
        m.critic.eval()
        batch["values"] = compute.value_forward(m.critic, batch, compute.NO_SP)
    times[PARTS[1]] = time.perf_counter() - t0
    scores = torch.zeros_like(batch["values"])  # (N, R)
    scores[:, -1] = torch.rand(len(scores))
    batch["advantages"], batch["returns"] = advantage.compute_gae_advantage_return(
        scores, batch["values"], batch["response_mask"].float(), 1.0, 1.0)

    actor = compute.ActorSettings(ppo_epochs=1, mini_batch=ROWS, micro_batch=MICRO, clip_ratio=CLIP, entropy_coeff=0.0,
                                  use_kl_loss=False, kl_loss_coef=0.001, kl_loss_type="low_var_kl", grad_clip=1.0,
                                  temperature=1.0)
    critic = compute.CriticSettings(ppo_epochs=1, mini_batch=ROWS, micro_batch=MICRO, cliprange_value=0.5, grad_clip=1.0)
    t0 = time.perf_counter()
    compute.update_actor(m.actor, m.actor_opt, batch, compute.NO_SP, actor)
    times[PARTS[2]] = time.perf_counter() - t0
    t0 = time.perf_counter()
    compute.update_critic(m.critic, m.critic_opt, batch, compute.NO_SP, critic)
    times[PARTS[3]] = time.perf_counter() - t0
    return times


# ---------------------------------------------------------------------------------------------
# Report

VARIANTS = ("plain torch", "engine compute code", "engine compute code + FSDP2 (world 1)")


def _med(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def _total(rows: list[dict[str, float]]) -> float:
    return statistics.median(sum(row.values()) for row in rows)


def fsdp_share(step: Callable[[], Any]) -> float:
    """Run ``step`` under torch.profiler -> the share of self CPU time spent in FSDP2's hooks and DTensor dispatch."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    fsdp = sum(e.self_cpu_time_total for e in events
               if "FSDP" in e.key or e.key in ("PythonSubclass", "RegisterPostBackwardFunctionBackward"))
    return fsdp / total if total else 0.0


def report(engine: Side, timed: dict[str, list[dict[str, float]]], *,
           args: argparse.Namespace, info: dict[str, Any], started: datetime,
           load: tuple[tuple[float, ...], tuple[float, ...]], fsdp_self: float) -> str:
    e = statistics.median(engine.step_s)
    plain, code, fsdp = (_total(timed[v]) for v in VARIANTS)
    pairs = [e_s / sum(row.values()) for e_s, row in zip(engine.step_s, timed[VARIANTS[0]], strict=True)]
    ratio = e / plain
    met = ratio <= 1.25
    lines = [
        "# Overhead: an engine PPO step vs the sum of its isolated passes in plain torch",
        "",
        f"- date: {started.strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {info['host']}, {info['cpu']}, {info['cores']} cores, no GPU; load average (1/5/15 min) "
        f"{load_text(load[0])} at the start, {load_text(load[1])} at the end "
        "(a shared machine)",
        f"- software: Python {info['python']}, torch {info['torch']}, transformers {info['transformers']}",
        f"- command: `.venv/bin/python bench/bench_overhead.py --steps {args.steps} "
        f"--response-length {args.response_length}`",
        f"- problem: builtin:tiny-llama (2 layers, hidden 64), fp32, sdpa, CPU, 1 torch thread; {ROWS} sequences a "
        f"step, prompts of 14 tokens, {args.response_length} response tokens; 1 PPO epoch, 1 mini-batch, "
        f"micro-batches of {MICRO}, AdamW",
        f"- measured: {args.steps} steps of each after one warm-up step, in turn: an engine step (`run_spec`, world "
        "size 1, one Ray rank actor, models unwrapped), then one step of each in-process variant; medians",
        "",
        "| part | " + " | ".join(VARIANTS) + " |",
        "|---|" + "---:|" * len(VARIANTS),
    ]
    for part in PARTS:
        lines.append(f"| {part} | " + " | ".join(f"{_med(timed[v], part) * 1000:.0f} ms" for v in VARIANTS) + " |")
    lines += [
        "| **sum** | " + " | ".join(f"**{_total(timed[v]) * 1000:.0f} ms**" for v in VARIANTS) + " |",
        "",
        f"Engine step (from the return of the previous metric callback to the next metric event): median **{e * 1000:.0f} ms** "
        f"(range {min(engine.step_s) * 1000:.0f} - {max(engine.step_s) * 1000:.0f} ms; its generation "
        f"`timing_s/gen` median {statistics.median(engine.gen_s) * 1000:.0f} ms).",
        "",
        f"**ratio = engine step / sum of plain parts = {ratio:.2f}x**; median of the per-turn ratios "
        f"{statistics.median(pairs):.2f}x (range {min(pairs):.2f} - {max(pairs):.2f}).",
        "",
        "Where the time goes, as factors that multiply to the ratio: "
        f"the compute code over plain torch {code / plain:.2f}x, "
        f"Ray dispatch and the controller's own work (rule reward, GAE, metrics, events) {e / code:.2f}x. "
        "At a world of 1 the engine leaves its models unwrapped (nothing to shard); wrapped with FSDP2 as at a "
        f"larger world, the in-process step would take {fsdp / code:.2f}x the unwrapped one: torch.profiler over "
        f"one in-process FSDP2 step (after the run) puts {fsdp_self:.0%} of its self CPU time in FSDP2's pre/post "
        "forward and backward hooks and DTensor dispatch (three FSDP units a model, two layers and the root; "
        "gathered once per rollout for the whole decode loop, gradients reduce-scattered once per mini-batch).",
        "",
        f"Target: at most 1.25x. **{'Met' if met else 'Not met'}**"
        + ("." if met else f": {ratio:.2f}x is {ratio / 1.25:.2f}x over it."),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="measured steps of each (one warm-up step more)")
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "overhead.md")
    args = parser.parse_args(argv)

    import torch.distributed as dist

    from worker.engine.rank import free_port

    started, load_start, info, cache_dir, folder = start_problem()
    ids, mask, eos, pad = prompt_batch(folder)
    r_len = args.response_length
    engine = Side("engine")
    timed: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    m = {VARIANTS[0]: Models(folder), VARIANTS[1]: Models(folder), VARIANTS[2]: Models(folder, fsdp=True)}
    generator = torch.Generator().manual_seed(0)
    steps = {VARIANTS[0]: lambda: plain_step(m[VARIANTS[0]], ids, mask, r_len, generator),
             VARIANTS[1]: lambda: inprocess_step(m[VARIANTS[1]], ids, mask, r_len, eos, pad, generator),
             VARIANTS[2]: lambda: inprocess_step(m[VARIANTS[2]], ids, mask, r_len, eos, pad, generator)}
    turns = [0]

    def between_steps() -> None:
        for variant, step in steps.items():
            row = step()
            if turns[0] > 0:  # the first step of each is a warm-up
                timed[variant].append(row)
        turns[0] += 1

    try:
        with local_ray():
            run_attnboard(engine, steps=args.steps, response_length=r_len, cache_dir=cache_dir,
                          run_id=f"bench-overhead-{os.getpid()}", between_steps=between_steps)
        fsdp_self = fsdp_share(steps[VARIANTS[2]])
    finally:
        dist.destroy_process_group()
    for i, (e, row) in enumerate(zip(engine.step_s, timed[VARIANTS[0]], strict=True), start=1):
        print(f"step {i}: engine {e * 1000:.0f} ms, plain {sum(row.values()) * 1000:.0f} ms, "
              f"ratio {e / sum(row.values()):.2f}x")
    text = report(engine, timed, args=args, info=info, started=started, load=(load_start, os.getloadavg()),
                  fsdp_self=fsdp_self)
    print(text)
    write_result(args.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

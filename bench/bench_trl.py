"""PPO step throughput: attnboard's engine against TRL 1.12.0's ``trl.experimental.ppo.PPOTrainer``.

    .venv/bin/python bench/bench_trl.py [--steps 3] [--rounds 2] [--response-length 16] [--out bench/results/trl.md]

Both sides train the same PPO problem in this one run, alternately (attnboard, TRL, attnboard, TRL, ...),
so a busy moment on a shared machine hits both alike:

- the same weights: ``builtin:tiny-llama`` materialised as an HF folder; the causal LM is the policy and the
  reference, ``worker.models.load_value_model`` (token classification, 1 label, the score head seeded) the
  critic and, for TRL, also the reward model; sdpa attention, fp32, CPU;
- the same batch: 32 sequences a step (attnboard: 8 ``builtin:count`` prompts x ``rollout.n`` 4; TRL: 32 of
  the same prompts), prompts of 14 tokens, ``--response-length`` sampled tokens at temperature 1;
- the same update: 1 PPO epoch, 1 mini-batch of 32, micro-batches of 2 (16 forward/backward passes per
  model, one optimizer step per model);
- one process of compute each, one torch thread each: attnboard through the real engine, ``run_spec`` with
  ``trainer.n_gpus_per_node=1`` (one Ray rank actor, FSDP2 over a world of 1, gloo); TRL in this process.

Throughput = generated response tokens / wall time of a step. A step's wall time is the time between two
consecutive step ends (attnboard: its ``metric`` events; TRL: ``on_step_end`` callbacks), so start-up
(Ray, process group, model loading) is outside it; the first step of every run is a warm-up and dropped.
Response tokens: attnboard's valid response tokens (its rows end at EOS; ``response_length/mean`` x rows),
TRL's generated tokens (``stop_token=None``: it always generates ``--response-length`` tokens). Counting the
EOS-ended rows' padding on TRL's side only is in TRL's favour.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "_work"
PROMPTS, SAMPLES, MICRO = 8, 4, 2  # 8 prompts x 4 samples = 32 sequences; micro-batches of 2
ROWS = PROMPTS * SAMPLES
TASK = "builtin:count"
MAX_PROMPT = 16
LR = 3e-3


@dataclass
class Side:
    """The measured steps of one implementation: wall seconds and response tokens per step."""

    name: str
    step_s: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    gen_s: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> list[float]:
        return [t / s for t, s in zip(self.tokens, self.step_s)]

    def median_tps(self) -> float:
        return statistics.median(self.tokens_per_s)


# ---------------------------------------------------------------------------------------------
# attnboard


def attnboard_spec(steps: int, response_length: int):
    from worker.presets import tiny_cpu_spec

    return tiny_cpu_spec(**{
        "trainer.n_gpus_per_node": 1,
        "trainer.total_training_steps": steps,
        "data.max_prompt_length": MAX_PROMPT,
        "data.max_response_length": response_length,
        "data.train_batch_size": PROMPTS,
        "actor_rollout_ref.rollout.n": SAMPLES,
        "actor_rollout_ref.actor.ppo_mini_batch_size": PROMPTS,  # one mini-batch: all 32 rows
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": MICRO,
        "critic.ppo_micro_batch_size_per_gpu": MICRO,
        "actor_rollout_ref.actor.ppo_epochs": 1,
        "actor_rollout_ref.actor.optim.lr": LR,
        "critic.optim.lr": LR,
    })


def run_attnboard(side: Side, *, steps: int, response_length: int, cache_dir: Path, run_id: str) -> None:
    """``steps`` + 1 engine steps; every step but the first is recorded in ``side``."""
    from worker.engine.controller import run_spec

    ends: list[tuple[float, dict[str, Any]]] = []

    def on_event(event: dict[str, Any]) -> None:
        if event["kind"] == "metric":
            ends.append((time.perf_counter(), event["payload"]["values"]))
        elif event["kind"] == "error":
            print(f"attnboard error: {event['payload'].get('message')}")

    state = run_spec(attnboard_spec(steps + 1, response_length), run_id=run_id, on_event=on_event, cache_dir=cache_dir)
    if state != "succeeded" or len(ends) != steps + 1:
        raise RuntimeError(f"attnboard run {run_id} ended {state} after {len(ends)} of {steps + 1} steps")
    for (t_prev, _), (t, values) in zip(ends, ends[1:]):
        side.step_s.append(t - t_prev)
        side.tokens.append(values["response_length/mean"] * ROWS)
        side.gen_s.append(values["timing_s/gen"])


# ---------------------------------------------------------------------------------------------
# TRL


def run_trl(side: Side, *, steps: int, response_length: int, folder: Path, out_dir: Path) -> None:
    """TRL's PPOTrainer for ``steps`` + 1 updates on the same models; every update but the first is recorded."""
    import datasets
    import torch
    from transformers import TrainerCallback

    from worker import data, models

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    from trl.experimental.ppo import ppo_trainer as trl_ppo

    tok = models.load_tokenizer(folder)
    tok.padding_side = "left"  # TRL generates from left-padded queries
    rows = data.load_prompts(TASK, tok, MAX_PROMPT, seed=0)
    dataset = datasets.Dataset.from_dict({"input_ids": [r.prompt_ids for r in rows]})

    def causal_lm():
        return models.load_causal_lm(folder, models.build_config(folder, {}, "sdpa"))

    def value_model():
        return models.load_value_model(folder, models.build_config(folder, {}, "sdpa"))

    config = PPOConfig(
        output_dir=str(out_dir), report_to="none", save_strategy="no", use_cpu=True, bf16=False, fp16=False,
        disable_tqdm=True, seed=0, learning_rate=LR, temperature=1.0, response_length=response_length,
        stop_token=None, missing_eos_penalty=None, num_sample_generations=0,
        per_device_train_batch_size=MICRO, gradient_accumulation_steps=ROWS // MICRO, num_mini_batches=1,
        num_ppo_epochs=1, local_rollout_forward_batch_size=ROWS, total_episodes=(steps + 1) * ROWS,
        dataloader_num_workers=0,
    )

    ends: list[float] = []
    gen_s: list[float] = []
    generated: list[int] = []

    class StepEnds(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ends.append(time.perf_counter())

    original = trl_ppo.batch_generation

    def timed_generation(model, queries, *args, **kwargs):  # TRL's own function, timed and its output counted
        t0 = time.perf_counter()
        query_responses, logits = original(model, queries, *args, **kwargs)
        gen_s.append(time.perf_counter() - t0)
        generated.append(int(query_responses.shape[0]) * (query_responses.shape[1] - queries.shape[1]))
        return query_responses, logits

    trainer = PPOTrainer(args=config, processing_class=tok, model=causal_lm(), ref_model=causal_lm(),
                         reward_model=value_model(), value_model=value_model(), train_dataset=dataset,
                         eval_dataset=dataset, callbacks=[StepEnds()])
    trl_ppo.batch_generation = timed_generation
    torch.set_num_threads(1)  # as the engine's rank (the Trainer set-up may have changed it)
    try:
        trainer.train()
    finally:
        trl_ppo.batch_generation = original
    if len(ends) != steps + 1:
        raise RuntimeError(f"TRL ran {len(ends)} updates, expected {steps + 1}")
    for i in range(1, steps + 1):
        side.step_s.append(ends[i] - ends[i - 1])
        side.tokens.append(float(generated[i]))
        side.gen_s.append(gen_s[i])


# ---------------------------------------------------------------------------------------------
# Report


def machine() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import transformers

    try:
        trl = version("trl")
    except PackageNotFoundError:
        trl = "not installed"
    cpu = platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {"host": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl}


def _row(side: Side) -> str:
    tps = side.tokens_per_s
    return (f"| {side.name} | {len(tps)} | {statistics.median(side.step_s):.2f} s | "
            f"{statistics.median(side.gen_s):.2f} s | {statistics.median(side.tokens):.0f} | "
            f"{statistics.median(tps):.1f} | {min(tps):.1f} - {max(tps):.1f} |")


def report(ours: Side, trl: Side, round_ratios: list[float], *, args: argparse.Namespace, info: dict[str, Any],
           started: datetime, load: tuple[tuple[float, float, float], tuple[float, float, float]]) -> str:
    ratio = ours.median_tps() / trl.median_tps()
    met = ratio >= 2.0
    lines = [
        "# PPO step throughput: attnboard vs TRL 1.12.0 PPOTrainer",
        "",
        f"- date: {started.strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {info['host']}, {info['cpu']}, {info['cores']} cores, no GPU; load average (1/5/15 min) "
        f"{'/'.join(f'{x:.1f}' for x in load[0])} at the start, {'/'.join(f'{x:.1f}' for x in load[1])} at the end "
        "(a shared machine)",
        f"- software: Python {info['python']}, torch {info['torch']}, transformers {info['transformers']}, "
        f"trl {info['trl']} (installed into the project venv; it changed neither torch nor transformers)",
        f"- command: `.venv/bin/python bench/bench_trl.py --steps {args.steps} --rounds {args.rounds} "
        f"--response-length {args.response_length}`",
        f"- problem: builtin:tiny-llama (2 layers, hidden 64), fp32, sdpa, CPU, 1 torch thread per side; "
        f"{ROWS} sequences a step, prompts of 14 tokens, {args.response_length} response tokens sampled at "
        f"temperature 1; 1 PPO epoch, 1 mini-batch, micro-batches of {MICRO}; policy, reference, critic (and "
        "TRL's reward model) from the same folder",
        f"- attnboard: `worker.engine.controller.run_spec`, world size 1 (one Ray rank actor, FSDP2, gloo), "
        "rule reward; TRL: `PPOTrainer.train()` in the bench process (reward model forward, KL in reward)",
        f"- measured: {args.rounds} rounds, each an attnboard run then a TRL run of {args.steps} + 1 steps; "
        "the first step of every run is a warm-up and dropped; step = time between consecutive step ends",
        "",
        "| side | steps | median step | median generation | response tokens / step | median tokens/s | "
        "tokens/s range |",
        "|---|---:|---:|---:|---:|---:|---:|",
        _row(ours),
        _row(trl),
        "",
        f"**attnboard / TRL tokens/s (medians): {ratio:.2f}x**; per round: "
        + ", ".join(f"{r:.2f}x" for r in round_ratios) + ".",
        "",
        f"Target: attnboard >= 2x TRL's tokens/s. **{'Met' if met else 'Not met'}**"
        + ("." if met else f": {ratio:.2f}x is {2.0 / ratio:.2f}x short of it."),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="measured steps per run (one warm-up step more)")
    parser.add_argument("--rounds", type=int, default=2, help="attnboard-then-TRL rounds")
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "trl.md")
    args = parser.parse_args(argv)

    import ray
    import torch

    from worker import models

    torch.set_num_threads(1)  # as each engine rank does (RankWorker)
    started = datetime.now(timezone.utc)
    load_start = os.getloadavg()
    info = machine()
    cache_dir = WORK / "models"
    folder = models.ensure_builtin_folder("builtin:tiny-llama", cache_dir)
    ours, trl = Side("attnboard"), Side("TRL 1.12.0")
    round_ratios = []
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             namespace="attnboard-bench")
    try:
        for r in range(args.rounds):
            a_round, t_round = Side("a"), Side("t")
            run_attnboard(a_round, steps=args.steps, response_length=args.response_length, cache_dir=cache_dir,
                          run_id=f"bench-trl-{os.getpid()}-{r}")
            run_trl(t_round, steps=args.steps, response_length=args.response_length, folder=folder,
                    out_dir=WORK / "trl-out")
            for side, part in ((ours, a_round), (trl, t_round)):
                side.step_s += part.step_s
                side.tokens += part.tokens
                side.gen_s += part.gen_s
            round_ratios.append(a_round.median_tps() / t_round.median_tps())
            print(f"round {r + 1}: attnboard {a_round.median_tps():.1f} tokens/s, TRL {t_round.median_tps():.1f} "
                  f"tokens/s, ratio {round_ratios[-1]:.2f}x", flush=True)
    finally:
        ray.shutdown()
    text = report(ours, trl, round_ratios, args=args, info=info, started=started, load=(load_start, os.getloadavg()))
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

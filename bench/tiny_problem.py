"""The tiny PPO problem ``bench/bench_overhead.py`` measures (the shape bench_trl.py measured before it moved to
the issue-20 shape): ``builtin:tiny-llama`` (2 layers, hidden 64), fp32, sdpa, CPU, one torch thread; 32
sequences a step (8 ``builtin:count`` prompts x 4 samples), 1 PPO epoch, 1 mini-batch, micro-batches of 2.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common import machine

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
        return [t / s for t, s in zip(self.tokens, self.step_s, strict=True)]

    def median_tps(self) -> float:
        return statistics.median(self.tokens_per_s)


# ---------------------------------------------------------------------------------------------
# attnboard


def attnboard_spec(steps: int, response_length: int):
    from worker.spec.presets import tiny_cpu_spec

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


StepHook = Callable[[], None]


def run_attnboard(side: Side, *, steps: int, response_length: int, cache_dir: Path, run_id: str,
                  between_steps: StepHook = lambda: None) -> None:
    """``steps`` + 1 engine steps; every step but the first is recorded in ``side``. ``between_steps`` runs
    after each step, inside the metric callback, and is not counted in the engine's step time."""
    from worker.engine.controller import run_spec

    resumed: list[float | None] = [None]

    def on_event(event: dict[str, Any]) -> None:
        if event["kind"] == "error":
            print(f"attnboard error: {event['payload'].get('message')}")
        if event["kind"] != "metric":
            return
        end = time.perf_counter()
        if resumed[0] is not None:
            values = event["payload"]["values"]
            side.step_s.append(end - resumed[0])
            side.tokens.append(values["response_length/mean"] * ROWS)
            side.gen_s.append(values["timing_s/gen"])
        between_steps()
        resumed[0] = time.perf_counter()

    state = run_spec(attnboard_spec(steps + 1, response_length), run_id=run_id, on_event=on_event, cache_dir=cache_dir)
    if state != "succeeded" or len(side.step_s) != steps:
        raise RuntimeError(f"attnboard run {run_id} ended {state} with {len(side.step_s)} of {steps} measured steps")



def start_problem() -> tuple[datetime, tuple[float, ...], dict[str, Any], Path, Path]:
    """The set-up this benchmark and bench_overhead share: 1 torch thread (as each engine rank has), the start
    time and load average, the machine, and the tiny-llama folder -> (started, load, machine, cache, folder)."""
    import torch

    from worker.engine import models

    torch.set_num_threads(1)
    started, load = datetime.now(UTC), os.getloadavg()
    cache_dir = WORK / "models"
    return started, load, machine(), cache_dir, models.ensure_builtin_folder("builtin:tiny-llama", cache_dir)

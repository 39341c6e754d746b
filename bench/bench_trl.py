"""attnboard's PPO and GRPO steps against TRL and the plain-torch floor, on a shape where compute dominates.

    .venv/bin/python bench/bench_trl.py --setup-trl           # once: make the two TRL venvs (below)
    .venv/bin/python bench/bench_trl.py                       # the full run (long: its PPO groups alone took 12
                                                              # minutes on 2 quiet cores)
    .venv/bin/python bench/bench_trl.py --groups ppo2,grpo2   # a subset of ppo1, ppo2, grpo1, grpo2, growth, packing
    .venv/bin/python bench/bench_trl.py --quick               # a tiny shape, 2 cores only, to check that every side runs

The shape (issue 20): Qwen2, hidden 512, intermediate 1408, 8 layers, 8 heads / 2 kv heads, vocab 8192, seeded
random weights saved as an HF folder with the project's character tokenizer; 16 prompts of 64 tokens, 64
response tokens sampled at temperature 1; fp32, sdpa, CPU; 1 PPO epoch, 1 mini-batch (every row), micro-batches
of 8, one AdamW step per trained model; the entropy coefficient 0; no KL term anywhere (attnboard's sides set
neither ``actor.use_kl_loss`` nor ``algorithm.use_kl_in_reward``, so the engine runs no reference forward).

Sides (``bench/bench_sides.py``, each a process of its own, set up one after the other, then stepped in turn):
- attnboard: the real engine, PPO (gae) and GRPO (n = 4), at 1 core (1 rank, 1 thread) and 2 cores (1 rank
  of 2 threads; 2 ranks of 1 thread, FSDP2 over gloo);
- TRL, at 1 and 2 torch threads, each in a venv of its own that sees the project's packages (a .pth file) and
  adds its TRL, accelerate and datasets (``TRL_VENVS``, made by ``--setup-trl``): PPO against TRL 1.12's
  ``trl.experimental.ppo.PPOTrainer`` (``bench/_work/trl-ppo-venv``; 1.13 removed it), GRPO against TRL 1.16's
  ``GRPOTrainer`` (n = 4, ``beta=0``; ``bench/_work/trl-grpo-venv``);
- floor: the plain-torch PPO (gae) and GRPO steps at 1 and 2 threads (``bench_sides.floor``: the least work
  each step needs).

Turns are interleaved (round 1: every side one step, round 2: ...) and the figures are medians. Robust to
interference: around every step the driver reads the machine's busy CPU time (/proc/stat) and this benchmark's
process tree's own (every process below the driver, Ray's included, /proc/PID/stat), and the difference is
what OTHER processes used. A step during which others used more than ``--threshold`` cores on average is
disturbed: it is repeated (at most ``--repeats`` times), and medians take the undisturbed attempts (all of
them, flagged, when none was). Every attempt's figure is in the result file.

Also: packed (``use_remove_padding``) vs padded forward/backward tokens/s of the actor on mixed lengths, sdpa
and eager; how attnboard's step grows with the batch and the response length; peak RSS per side (the largest
process, and the whole process tree: attnboard's with its Ray processes), and at 2 cores attnboard's best
side's against TRL's. A group left out of ``--groups`` says "not run" in the result file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Every side (and the packing case here) waits for its OpenMP threads passively, as attnboard's ranks of several
# threads do (worker.engine.ranks.rank_env): set before torch loads, inherited by the side processes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: the sibling bench modules
from common import load_text, machine, write_result

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / "_work"
# The venv each TRL side runs in, and the TRL it pins (issue 20): PPO against the last TRL with
# trl.experimental.ppo.PPOTrainer (1.13 removed it), GRPO against 1.16's GRPOTrainer.
TRL_VENVS = {"trl-ppo": (WORK / "trl-ppo-venv", "trl==1.12.0"), "trl-grpo": (WORK / "trl-grpo-venv", "trl==1.16.0")}
SIDES = Path(__file__).resolve().parent / "bench_sides.py"
CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

FULL = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8, "num_attention_heads": 8,
        "num_key_value_heads": 2, "vocab_size": 8192}
QUICK = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 512}


# ---------------------------------------------------------------------------------------------
# The machine: CPU used by others, peak memory of a process tree


def busy_ticks() -> int:
    """Busy CPU ticks of the whole machine since boot (/proc/stat: user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return user + nice + system + irq + softirq + steal


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree(root: int) -> list[int]:
    """``root`` and every process below it (Ray's raylet, GCS and rank workers included)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def tree_ticks(root: int) -> int:
    """CPU ticks the tree has used: its live processes' own and their reaped children's (utime, stime,
    cutime, cstime)."""
    total = 0
    for pid in tree(root):
        fields = _stat(pid)
        if fields:
            total += sum(int(x) for x in fields[11:15])
    return total


def peak_rss_mb(pids: list[int]) -> tuple[float, float]:
    """(the largest VmHWM, the sum of VmHWM) over ``pids``, in MiB."""
    peaks = []
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peaks.append(int(line.split()[1]) / 1024)
        except OSError:
            continue
    return (max(peaks) if peaks else 0.0, sum(peaks))


# ---------------------------------------------------------------------------------------------
# Sides


@dataclass
class Attempt:
    round: int
    step_s: float
    others_cores: float
    disturbed: bool


@dataclass
class Side:
    """One process of ``bench_sides.py`` and what it measured."""

    label: str  # e.g. "attnboard 2 ranks x 1 thread"
    kind: str  # attnboard | floor | trl-ppo | trl-grpo
    cfg: dict[str, Any]
    python: str = sys.executable
    attempts: list[Attempt] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    peak_mb: tuple[float, float] = (0.0, 0.0)
    unavailable: str = ""
    proc: subprocess.Popen | None = None
    log: Path | None = None

    def start(self) -> None:
        logs = Path(self.cfg["work"]) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log = logs / ("".join(c if c.isalnum() else "-" for c in self.label) + ".log")
        with self.log.open("w") as stderr:  # the side's own messages, for when it fails
            self.proc = subprocess.Popen([self.python, str(SIDES), self.kind, json.dumps(self.cfg)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT)
        answer = self.read()
        if answer.get("event") == "unavailable":
            self.unavailable = answer["reason"]
            self.proc.wait()
            self.proc = None
        elif answer.get("event") != "ready":
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.label}: {answer}; its log {self.log} ends:\n{tail}")

    def read(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                return json.loads(line[3:])
        code = self.proc.wait()
        return {"event": "exit", "code": code}

    def step(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        answer = self.read()
        if answer.get("event") != "step":
            raise RuntimeError(f"{self.label}: expected a step, got {answer}")
        self.peak_mb = max(self.peak_mb, peak_rss_mb(tree(self.proc.pid)))
        return answer

    def stop(self) -> None:
        if self.proc is None:
            return
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=120)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.proc.kill()
        self.proc = None

    def undisturbed(self) -> list[Attempt]:
        calm = [a for a in self.attempts if not a.disturbed]
        return calm or self.attempts

    def median_s(self) -> float | None:
        kept = self.undisturbed()
        return statistics.median(a.step_s for a in kept) if kept else None

    def flagged(self) -> bool:
        return bool(self.attempts) and not any(not a.disturbed for a in self.attempts)


def measured_step(side: Side, round_no: int, threshold: float) -> Attempt:
    busy0, ours0, t0 = busy_ticks(), tree_ticks(os.getpid()), time.perf_counter()
    answer = side.step()
    wall = time.perf_counter() - t0
    others = max(0.0, (busy_ticks() - busy0) - (tree_ticks(os.getpid()) - ours0)) / CLK
    attempt = Attempt(round_no, float(answer["step_s"]), others / wall if wall > 0 else 0.0, False)
    attempt.disturbed = attempt.others_cores > threshold
    side.tokens.append(float(answer.get("tokens", 0.0)))
    return attempt


def run_group(sides: list[Side], *, steps: int, repeats: int, threshold: float) -> None:
    """Set every side up (one after the other), then ``steps`` rounds of one step each in turn; a disturbed
    step is taken again, at most ``repeats`` times."""
    try:
        for side in sides:
            print(f"  starting {side.label} ...", flush=True)
            side.start()
            if side.unavailable:
                print(f"  {side.label}: unavailable ({side.unavailable})", flush=True)
        live = [s for s in sides if not s.unavailable]
        for round_no in range(1, steps + 1):
            for side in live:
                for _ in range(repeats + 1):
                    attempt = measured_step(side, round_no, threshold)
                    side.attempts.append(attempt)
                    print(f"  round {round_no} {side.label}: {attempt.step_s:.2f} s, others used "
                          f"{attempt.others_cores:.2f} cores{' (disturbed)' if attempt.disturbed else ''}", flush=True)
                    if not attempt.disturbed:
                        break
    finally:
        for side in sides:
            side.stop()


# ---------------------------------------------------------------------------------------------
# The problem: the model folder, the prompts


def make_folder(shape: dict[str, int], work: Path) -> Path:
    """A Qwen2 of ``shape`` with seeded random weights and the character tokenizer, as an HF folder."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from worker.engine import models

    name = "qwen2-" + "-".join(str(shape[k]) for k in sorted(shape))
    folder = work / "models" / name
    if (folder / "config.json").is_file():
        return folder
    vocab = models.char_vocab()
    config = Qwen2Config(**shape, bos_token_id=vocab[models.BOS], eos_token_id=vocab[models.EOS],
                         pad_token_id=vocab[models.PAD], use_sliding_window=False, tie_word_embeddings=False)
    with models.seeded(0):
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(folder)
    models.build_char_tokenizer().save_pretrained(folder)
    return folder


def prompt_text(prompt_len: int) -> str:
    """A prompt that tokenizes to ``prompt_len`` tokens (BOS, its characters, the newline of the simple
    template)."""
    body = ("count the digits of 31415926535 and say them back; " * 8)[: prompt_len - 2]
    return body + "\n"


def make_data(text: str, prompts: int, work: Path) -> Path:
    """A verl-format parquet of ``prompts`` copies of the prompt (the template adds the newline back)."""
    from worker.ppo import data

    rows = [{"prompt": [{"role": "user", "content": text[:-1]}], "data_source": "count",
             "reward_model": {"style": "rule", "ground_truth": "3141"}} for _ in range(prompts)]
    return data.write_parquet(rows, work / f"prompts-{len(text)}-{prompts}.parquet")


# ---------------------------------------------------------------------------------------------
# Packed vs padded (in this process)


def packing_case(folder: Path, *, threads: int, rows: int, max_len: int, repeats: int) -> list[dict[str, Any]]:
    """Actor forward + backward of one mixed-length micro-batch, padded and packed, sdpa and eager ->
    real tokens/s per (implementation, layout)."""
    import torch

    from worker.engine import compute, models

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    p, r = max_len // 2, max_len // 2
    lengths = torch.randint(p // 4, p + 1, (rows,), generator=gen), torch.randint(r // 4, r + 1, (rows,), generator=gen)
    prompt_mask = torch.stack([torch.cat([torch.zeros(p - int(n)), torch.ones(int(n))]) for n in lengths[0]]).long()
    response_mask = torch.stack([torch.cat([torch.ones(int(n)), torch.zeros(r - int(n))]) for n in lengths[1]]).long()
    prompt = torch.randint(4, 80, (rows, p), generator=gen) * prompt_mask
    responses = torch.randint(4, 80, (rows, r), generator=gen) * response_mask
    batch = {**compute.assemble(prompt, prompt_mask, responses, response_mask), "responses": responses,
             "response_mask": response_mask}
    tokens = int(batch["attention_mask"].sum())
    out = []
    for impl in ("sdpa", "eager"):
        model = models.load_causal_lm(folder, models.build_config(folder, {}, impl)).train()
        for packed in (False, True):
            times = []
            for _ in range(repeats + 1):
                t0 = time.perf_counter()
                logp, _ = compute.policy_forward(model, batch, compute.NO_SP, temperature=1.0, with_entropy=False,
                                                 remove_padding=packed)
                (logp * response_mask).sum().backward()
                model.zero_grad(set_to_none=True)
                times.append(time.perf_counter() - t0)
            median = statistics.median(times[1:])
            out.append({"implementation": impl, "layout": "packed" if packed else "padded", "rows": rows,
                        "padded_tokens": rows * (p + r), "real_tokens": tokens, "s": median, "tokens_per_s": tokens / median})
    return out


# ---------------------------------------------------------------------------------------------
# The plan and the report


# The groups ``--groups`` picks from, in the order they run; the step groups' titles.
GROUPS = ("ppo1", "ppo2", "grpo1", "grpo2", "growth", "packing")
STEP_GROUPS = {"ppo1": "PPO (gae), 1 core(s)", "ppo2": "PPO (gae), 2 core(s)", "grpo1": "GRPO (n=4), 1 core(s)",
               "grpo2": "GRPO (n=4), 2 core(s)"}


def parse_groups(text: str) -> list[str]:
    """``--groups``: comma-separated names from ``GROUPS`` -> those names, in ``GROUPS``' order."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in GROUPS]
    if unknown or not names:
        problem = f"no group {', '.join(map(repr, unknown))}" if unknown else "names no group"
        raise argparse.ArgumentTypeError(f"--groups {text!r}: {problem}; valid: a comma-separated subset of "
                                         f"{', '.join(GROUPS)}")
    return [name for name in GROUPS if name in names]


def plan(args: argparse.Namespace, folder: Path, work: Path) -> tuple[dict[str, Any], dict[str, list[Side]]]:
    """-> (the shape every step group shares, {group: its sides}) for the groups of ``args.groups`` that step
    (every one but packing); ``--quick`` runs the 2-core groups only."""
    prompts = 4 if args.quick else 16
    prompt_len = 16 if args.quick else 64
    response_len = 8 if args.quick else 64
    micro = 4 if args.quick else 8
    max_steps = 1 + args.steps * (args.repeats + 1)
    text = prompt_text(prompt_len)
    base = {"folder": str(folder), "work": str(work), "prompts": prompts, "prompt_len": prompt_len,
            "response_len": response_len, "micro": micro, "max_steps": max_steps, "prompt_text": text,
            "data": str(make_data(text, prompts, work))}

    def side(label: str, kind: str, *, algo: str, n: int, threads: int, ranks: int = 1, **extra: Any) -> Side:
        cfg = {**base, "algo": algo, "n": n, "threads": threads, "ranks": ranks, **extra}
        python = TRL_VENVS[kind][0] / "bin" / "python" if kind in TRL_VENVS else Path(sys.executable)
        return Side(label, kind, cfg, python=str(python))

    def step_group(algo: str, n: int, threads: int, trl: str) -> list[Side]:
        sides = [side(f"attnboard 1 rank x {threads} thread(s)", "attnboard", algo=algo, n=n, threads=threads)]
        if threads == 2:
            sides.append(side("attnboard 2 ranks x 1 thread", "attnboard", algo=algo, n=n, threads=2, ranks=2))
        kind = "trl-ppo" if algo == "gae" else "trl-grpo"
        return [*sides, side(f"TRL {trl}, {threads} thread(s)", kind, algo=algo, n=n, threads=threads),
                side(f"plain torch, {threads} thread(s)", "floor", algo=algo, n=n, threads=threads)]

    groups: dict[str, list[Side]] = {}
    for name in args.groups:
        if name in STEP_GROUPS and not (args.quick and name.endswith("1")):
            threads = int(name[-1])  # ppo1 .. grpo2: the cores
            groups[name] = (step_group("gae", 1, threads, "PPOTrainer") if name.startswith("ppo")
                            else step_group("grpo", 4, threads, "GRPOTrainer"))
    if "growth" in args.groups:
        growth = []
        for prompts_n, resp in ((prompts // 2, response_len), (prompts * 2, response_len),
                                (prompts, response_len // 2), (prompts, response_len * 2)):
            cfg = {**base, "prompts": prompts_n, "response_len": resp, "data": str(make_data(text, prompts_n, work)),
                   "max_steps": 2 + args.growth_steps - 1, "algo": "gae", "n": 1, "threads": 2, "ranks": 1}
            growth.append(Side(f"attnboard PPO, {prompts_n} prompts x {resp} response tokens", "attnboard", cfg))
        groups["growth"] = growth
    return base, groups


def _fmt(x: float | None, unit: str = "s") -> str:
    return "-" if x is None else f"{x:.2f} {unit}".strip()


def _gib(side: Side) -> str:
    """``largest / tree GiB``: the side's peak RSS."""
    return f"{side.peak_mb[0] / 1024:.2f} / {side.peak_mb[1] / 1024:.2f} GiB"


def _not_run(name: str, args: argparse.Namespace) -> str:
    why = "--quick runs the 2-core groups only" if args.quick and name in ("ppo1", "grpo1") else \
        f"not in --groups {','.join(args.groups)}"
    return f"not run ({why})"


def ratio_lines(algo: str, sides: list[Side]) -> list[str]:
    """The 2-core group's ratios for ``algo``: attnboard's best side's median against TRL's and the floor's, then
    its peak RSS against TRL's."""
    measured = [(s, s.median_s()) for s in sides if not s.unavailable]
    medians = [(s, m) for s, m in measured if m is not None]
    ours = [(s, m) for s, m in medians if s.kind == "attnboard"]
    if not ours:
        return [f"- {algo}: no attnboard side measured"]
    best, best_s = min(ours, key=lambda sm: sm[1])
    parts = [f"attnboard's best ({best.label}) {best_s:.2f} s"]
    fastest: dict[str, Side] = {}
    for name, kinds in (("TRL", ("trl-ppo", "trl-grpo")), ("the 2-thread floor", ("floor",))):
        theirs = [(s, m) for s, m in medians if s.kind in kinds]
        if not theirs:
            parts.append(f"{name}: not measured")
            continue
        fastest[name], value = min(theirs, key=lambda sm: sm[1])
        parts.append(f"{best_s / value:.2f}x {name} ({value:.2f} s)")
    trl = fastest.get("TRL")
    rss = f"vs TRL's ({trl.label}) {_gib(trl)}" if trl is not None else "TRL's: not measured"
    return [f"- {algo}: " + "; ".join(parts),
            f"- {algo} peak RSS (largest process / process tree): attnboard's best ({best.label}) {_gib(best)} {rss}"]


def report(base: dict[str, Any], groups: dict[str, list[Side]], packing: list[dict[str, Any]] | None, *,
           args: argparse.Namespace, info: dict[str, Any], started: datetime, loads: tuple, trl: dict[str, str],
           wall_s: float) -> str:
    """The result file: the header, a table per step group, the 2-core ratios, packing, growth; a group that did
    not run says so."""
    command = "`.venv/bin/python bench/bench_trl.py" + (" --quick" if args.quick else "") + \
        ("" if tuple(args.groups) == GROUPS else f" --groups {','.join(args.groups)}") + "`"
    shape = QUICK if args.quick else FULL
    versions = " and ".join(f"TRL {trl[kind]} for {kind} ({venv.relative_to(ROOT)}, {pin})"
                            for kind, (venv, pin) in TRL_VENVS.items())
    lines = [
        "# attnboard's PPO and GRPO step vs TRL and the plain-torch floor"
        + (" (QUICK MODE: not a result)" if args.quick else ""),
        "",
        f"- date: {started.strftime('%Y-%m-%d %H:%M UTC')}; wall time {wall_s / 60:.1f} min",
        f"- machine: {info['host']}, {info['cpu']}, {info['cores']} cores; load average {load_text(loads[0])} at the "
        f"start, {load_text(loads[1])} at the end",
        f"- software: Python {info['python']}, torch {info['torch']}, transformers {info['transformers']}; {versions}",
        f"- command: {command}",
        f"- shape: Qwen2 {shape}, fp32, sdpa, CPU; {base['prompts']} prompts of {base['prompt_len']} tokens, "
        f"{base['response_len']} response tokens; 1 epoch, 1 mini-batch, micro-batches of {base['micro']}; entropy "
        "coefficient 0; no KL term (no reference forward); attnboard with use_remove_padding (verl's default)",
        f"- every side runs with OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} (attnboard's multi-thread ranks' default)",
        f"- interference: a step during which other processes used more than {args.threshold} cores (machine busy "
        f"time from /proc/stat minus this benchmark's process tree) is disturbed and taken again, at most "
        f"{args.repeats} times; medians over undisturbed attempts (flagged * where every attempt was disturbed)",
        "",
    ]
    for name, title in STEP_GROUPS.items():
        lines += [f"## {title}", ""]
        if name not in groups:
            lines += [_not_run(name, args), ""]
            continue
        lines += ["| side | median s/step | attempts (s, others' cores) | peak RSS: largest process / process tree |",
                  "|---|---:|---|---:|"]
        for s in groups[name]:
            if s.unavailable:
                lines.append(f"| {s.label} | unavailable | {s.unavailable[:160]} | - |")
                continue
            attempts = ", ".join(f"{a.step_s:.2f} ({a.others_cores:.2f}{'!' if a.disturbed else ''})" for a in s.attempts)
            lines.append(f"| {s.label} | {_fmt(s.median_s())}{' *' if s.flagged() else ''} | {attempts} | {_gib(s)} |")
        lines.append("")
    lines += ["## Ratios at 2 cores (medians)", ""]
    for name, algo in (("ppo2", "PPO (gae)"), ("grpo2", "GRPO (n=4)")):
        lines += ratio_lines(algo, groups[name]) if name in groups else [f"- {algo}: {_not_run(name, args)}"]
    lines += ["", "## Packed (use_remove_padding) vs padded, actor forward + backward, mixed lengths", ""]
    if packing is None:
        lines.append(_not_run("packing", args))
    else:
        lines += ["| implementation | layout | rows | tokens in the padded batch | real tokens | s | real tokens/s |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for row in packing:
            lines.append(f"| {row['implementation']} | {row['layout']} | {row['rows']} | {row['padded_tokens']} | "
                         f"{row['real_tokens']} | {row['s']:.3f} | {row['tokens_per_s']:.0f} |")
    lines += ["", "## How attnboard's PPO step grows (1 rank x 2 threads)", ""]
    if "growth" not in groups:
        lines.append(_not_run("growth", args))
    else:
        lines += ["| prompts x response tokens | median s/step | attempts |", "|---|---:|---|"]
        for s in groups["growth"]:
            attempts = ", ".join(f"{a.step_s:.2f}{'!' if a.disturbed else ''}" for a in s.attempts)
            lines.append(f"| {s.cfg['prompts']} x {s.cfg['response_len']} | {_fmt(s.median_s())}"
                         f"{' *' if s.flagged() else ''} | {attempts} |")
    return "\n".join(lines) + "\n"


def setup_trl() -> int:
    """Make both TRL venvs (``TRL_VENVS``): each sees the project's packages (a .pth file) and adds its pinned TRL,
    accelerate and datasets from the package index pip is configured with. -> pip's exit code (0: both made)."""
    ours = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
    for kind, (venv, pin) in TRL_VENVS.items():
        print(f"making {venv} ({pin}, for the {kind} sides) ...", flush=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        site = next((venv / "lib").glob("python3*/site-packages"))
        (site / "attnboard-venv.pth").write_text(f"{ours}\n{ROOT}\n")
        code = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", pin, "accelerate", "datasets"]).returncode
        if code != 0:
            print(f"pip install {pin} into {venv} failed with exit code {code}", file=sys.stderr)
            return code
    return 0


def trl_version(venv: Path) -> str:
    """The TRL version the venv's Python imports, or why it cannot."""
    done = subprocess.run([str(venv / "bin" / "python"), "-c", "import trl; print(trl.__version__)"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "not installed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny shape and one round: checks that every side runs")
    parser.add_argument("--groups", type=parse_groups, default=list(GROUPS),
                        help=f"comma-separated groups to run, from {','.join(GROUPS)} (default: all)")
    parser.add_argument("--steps", type=int, default=None, help="measured rounds per group (default 2, quick 1)")
    parser.add_argument("--growth-steps", type=int, default=1, help="measured steps per growth point")
    parser.add_argument("--repeats", type=int, default=None, help="retakes of a disturbed step (default 1, quick 0)")
    parser.add_argument("--threshold", type=float, default=0.25, help="others' cores above which a step is disturbed")
    parser.add_argument("--setup-trl", action="store_true",
                        help="make bench/_work/trl-ppo-venv (TRL 1.12) and bench/_work/trl-grpo-venv (TRL 1.16) first")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--work", type=Path, default=WORK,
                        help="where the model folders, prompts and logs go (default bench/_work; the TRL venvs stay there)")
    args = parser.parse_args(argv)
    args.steps = args.steps if args.steps is not None else (1 if args.quick else 2)
    args.repeats = args.repeats if args.repeats is not None else (0 if args.quick else 1)
    out = args.out or (args.work / "trl_quick.md" if args.quick else ROOT / "bench" / "results" / "trl.md")
    if args.setup_trl and setup_trl() != 0:
        return 1

    started, load_start, t0 = datetime.now(UTC), os.getloadavg(), time.perf_counter()
    info = machine()
    work = args.work / ("quick" if args.quick else "full")
    work.mkdir(parents=True, exist_ok=True)
    folder = make_folder(QUICK if args.quick else FULL, work)
    base, groups = plan(args, folder, work)
    needed = {s.kind for sides in groups.values() for s in sides} & set(TRL_VENVS)
    missing = [str(TRL_VENVS[kind][0]) for kind in sorted(needed) if not (TRL_VENVS[kind][0] / "bin" / "python").exists()]
    if missing:
        print(f"no {', '.join(missing)}: run with --setup-trl once", file=sys.stderr)
        return 2
    trl = {kind: trl_version(venv) if kind in needed else "-" for kind, (venv, _pin) in TRL_VENVS.items()}
    for name, sides in groups.items():
        print(f"{STEP_GROUPS.get(name, name)}:", flush=True)
        steps = args.growth_steps if name == "growth" else args.steps
        run_group(sides, steps=steps, repeats=0 if name == "growth" else args.repeats, threshold=args.threshold)
    packing = None
    if "packing" in args.groups:
        print("packed vs padded ...", flush=True)
        packing = packing_case(folder, threads=2, rows=4 if args.quick else 8, max_len=32 if args.quick else 256,
                               repeats=1 if args.quick else 3)
    text = report(base, groups, packing, args=args, info=info, started=started, loads=(load_start, os.getloadavg()),
                  trl=trl, wall_s=time.perf_counter() - t0)
    print(text)
    write_result(out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

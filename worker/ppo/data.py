"""Prompts for a run: built-in tasks generated in code, or verl-format parquet files.

A row, in verl's format (``examples/data_preprocess/gsm8k.py``)::

    {"prompt": [{"role": "user", "content": "count from 3"}],
     "data_source": "count",
     "reward_model": {"style": "rule", "ground_truth": "34567"}}

``load_prompts`` turns rows into ``PromptRow``s: the chat messages rendered to text, tokenized, and
checked against ``data.max_prompt_length``. Rendering uses the tokenizer's chat template when it has one;
otherwise (the built-in character tokenizer has none) the simple template ``render_simple``: each
message's content followed by a newline, roles not written, so the model answers after the last newline
(``"count from 3\\n"``). Short on purpose: the tiny presets run with prompts of 16 tokens.

Built-in tasks (``builtin:<task>``), each seeded and scored by the reward of the same name:

- ``builtin:count``: "count from d" (d in 0..5) -> the five digits from d ("34567"). The learnable one:
  the ``count`` reward gives 0.5 per position for any digit and 1 for the right one, over
  max(response, target) length. A randomly initialised tiny model emits near-uniform characters
  (74 tokens, 10 of them digits) for all 8 response tokens: expected reward about
  5 * (1/74 + 0.5 * 9/74) / 8 = 0.046 (measured 0.04-0.06). Emitting only digits lifts it to 0.31
  (0.5 if it also stops after five), the right digits to 1.0. Measured with a plain policy-gradient
  loop (tests/worker/ppo/test_data.py): about 0.05 -> 0.2 in 15 steps and -> 0.33 in 30 (lr 3e-3, 8
  prompts x 4 samples).
- ``builtin:copy``: "copy cat" -> "cat" (3-5 random lowercase letters), reward ``copy``.
- ``builtin:arith``: "what is 3+4?" -> "7" (single-digit addition), reward ``gsm8k``: the response
  must contain ``#### 7``, as in GSM8K.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

BUILTIN_PREFIX = "builtin:"
BUILTIN_TASK_ROWS = 256
REQUIRED_COLUMNS = ("prompt", "data_source", "reward_model")
TRUNCATIONS = ("error", "left", "right")


class DataError(ValueError):
    """Data that cannot be used; the message names the file (or task), the row or column, and what is valid."""


@dataclass(frozen=True)
class PromptRow:
    prompt_text: str
    prompt_ids: list[int]
    data_source: str
    ground_truth: str


# --------------------------------------------------------------------------------------------
# Built-in tasks

TaskFn = Callable[[random.Random, int], list[dict[str, Any]]]
TASKS: dict[str, TaskFn] = {}


def register_task(name: str) -> Callable[[TaskFn], TaskFn]:
    def decorator(fn: TaskFn) -> TaskFn:
        if name in TASKS:
            raise ValueError(f"built-in task {name!r} is already registered")
        TASKS[name] = fn
        return fn

    return decorator


def make_row(content: str, data_source: str, ground_truth: str) -> dict[str, Any]:
    """One row in verl's format, a single user message."""
    return {
        "prompt": [{"role": "user", "content": content}],
        "data_source": data_source,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
    }


COUNT_LENGTH = 5


@register_task("count")
def _count_rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    rows = []
    for _ in range(n):
        start = rng.randint(0, 10 - COUNT_LENGTH)
        target = "".join(str(d) for d in range(start, start + COUNT_LENGTH))
        rows.append(make_row(f"count from {start}", "count", target))
    return rows


@register_task("copy")
def _copy_rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    rows = []
    for _ in range(n):
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 5)))
        rows.append(make_row(f"copy {word}", "copy", word))
    return rows


@register_task("arith")
def _arith_rows(rng: random.Random, n: int) -> list[dict[str, Any]]:
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append(make_row(f"what is {a}+{b}?", "arith", str(a + b)))
    return rows


def builtin_rows(name: str, *, seed: int, n: int = BUILTIN_TASK_ROWS) -> list[dict[str, Any]]:
    """``n`` rows of a built-in task (``builtin:count`` or ``count``), the same for the same seed."""
    task = name[len(BUILTIN_PREFIX):] if name.startswith(BUILTIN_PREFIX) else name
    if task not in TASKS:
        raise DataError(f"data.train_files {name!r}: unknown built-in task; valid: "
                        f"{', '.join(BUILTIN_PREFIX + t for t in TASKS)}")
    return TASKS[task](random.Random(f"{task}:{seed}"), n)


# --------------------------------------------------------------------------------------------
# Parquet (I/O edge)


def write_parquet(rows: list[dict[str, Any]], path: Path | str) -> Path:
    """Write verl-format rows to a parquet file (for tests, and to export a built-in task for verl)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def read_parquet(path: Path | str) -> list[dict[str, Any]]:
    """Rows of a verl-format parquet file; a missing file or column is a DataError naming both."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"data.train_files {str(path)!r} does not exist or is not a file; give a verl-format "
                        f"parquet file or a built-in task ({', '.join(BUILTIN_PREFIX + t for t in TASKS)})")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"data.train_files {str(path)!r} is not a readable parquet file: {exc}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise DataError(f"{path}: missing column {missing[0]!r}; a verl-format file has columns "
                        f"{', '.join(REQUIRED_COLUMNS)} (found: {', '.join(table.column_names)})")
    reward_type = table.schema.field("reward_model").type
    if not (pa.types.is_struct(reward_type) and reward_type.get_field_index("ground_truth") >= 0):
        raise DataError(f"{path}: column 'reward_model' must be a struct with a 'ground_truth' field "
                        f"(reward_model.ground_truth), found type {reward_type}")
    return table.select(list(REQUIRED_COLUMNS)).to_pylist()


# --------------------------------------------------------------------------------------------
# Rendering and tokenizing


def render_simple(messages: list[dict[str, str]]) -> str:
    """The template for tokenizers without a chat template: each content then a newline, roles unwritten."""
    return "".join(f"{m['content']}\n" for m in messages)


def render_prompt(messages: list[dict[str, str]], tokenizer: Any) -> tuple[str, bool]:
    """The prompt text, and whether it already holds the special tokens (a chat template adds them)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), True
    return render_simple(messages), False


def _check_row(row: dict[str, Any], where: str) -> tuple[list[dict[str, str]], str, str]:
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not (isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
            for m in prompt)):
        raise DataError(f"{where}: column 'prompt' must be a non-empty list of chat messages "
                        f"{{'role': ..., 'content': ...}}, got a {type(prompt).__name__}")  # no file content in errors
    reward_model = row.get("reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    if truth is None:
        raise DataError(f"{where}: reward_model.ground_truth is missing")
    source = row.get("data_source")
    if not isinstance(source, str) or not source:
        raise DataError(f"{where}: column 'data_source' must be a non-empty string, got "
                        f"{'an empty string' if source == '' else 'a ' + type(source).__name__}")
    return prompt, source, str(truth)


def load_prompts(
    train_files: str | list[str],
    tokenizer: Any,
    max_prompt_length: int,
    *,
    seed: int,
    truncation: Literal["error", "left", "right"] = "error",
) -> list[PromptRow]:
    """Every prompt of ``train_files`` (a built-in task, a parquet file, or a list of parquet files read one
    after the other into one dataset, as verl does), tokenized, in a seeded shuffle.

    A prompt longer than ``max_prompt_length`` tokens is refused (``truncation="error"``, verl's
    default) or cut, keeping its end (``left``) or its start (``right``).
    """
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation {truncation!r} is not valid; valid: {', '.join(TRUNCATIONS)}")
    sourced: list[tuple[str, int, dict[str, Any]]] = []  # (origin, row number in it, row)
    for name in [train_files] if isinstance(train_files, str) else train_files:
        if name.startswith(BUILTIN_PREFIX):
            rows, origin = builtin_rows(name, seed=seed), name
        else:
            rows, origin = read_parquet(name), str(Path(name).expanduser())
        if not rows:
            raise DataError(f"data.train_files {origin!r} holds no rows")
        sourced.extend((origin, i, row) for i, row in enumerate(rows))
    out = []
    for origin, i, row in sourced:
        where = f"{origin} row {i}"
        messages, source, truth = _check_row(row, where)
        text, templated = render_prompt(messages, tokenizer)
        ids = list(tokenizer(text, add_special_tokens=not templated)["input_ids"])
        if len(ids) > max_prompt_length:
            if truncation == "error":
                raise DataError(f"{where}: the prompt is {len(ids)} tokens, longer than data.max_prompt_length "
                                f"({max_prompt_length}); raise data.max_prompt_length or "
                                f"shorten the prompt")
            ids = ids[-max_prompt_length:] if truncation == "left" else ids[:max_prompt_length]
        out.append(PromptRow(prompt_text=text, prompt_ids=ids, data_source=source, ground_truth=truth))
    random.Random(seed).shuffle(out)
    return out


def export_builtin_task(name: str, path: Path | str, *, seed: int, n: int = BUILTIN_TASK_ROWS) -> Path:
    """A built-in task as a verl-format parquet file, e.g. to train the same task with verl."""
    return write_parquet(builtin_rows(name, seed=seed, n=n), path)

"""What the walk knows: variables, functions, the script's arguments, the branch it is in and the work done."""

from __future__ import annotations

from collections.abc import Mapping

from worker.interop.shell.results import MAX_STEPS, Script, ShellBudgetError, ShellError
from worker.interop.shell.syntax import _Source
from worker.interop.shell.values import Value, _Positional, _Var


class ReaderState:
    """The walk's bookkeeping; the concerns (``arithmetic``, ``words``, ``statements``) build on it."""

    def __init__(self, text: str, max_steps: int = MAX_STEPS, environment: Mapping[str, str] | None = None):
        self.src = _Source(text)
        self.max_steps = max_steps
        self.environment: dict[str, str] = dict(environment or {})
        self.script = Script()
        self.vars: dict[str, _Var] = {}
        self.exported: set[str] = set()
        self.assigned_anywhere: set[str] = set()
        self.ever_set: set[str] = set()
        """Variables the walk has assigned or unset so far: one read before that may come from the environment."""
        self.functions: dict[str, object] = {}
        self.positional: list[Value] | _Positional = _Positional()
        self.steps = 0
        self.depth = 0
        self.condition: list[str] = []
        self.loops: list[str] = []
        self.arith_status: tuple[int | None, bool | None] = (None, None)
        """The status of the last ``(( ))`` run, by its start byte: its test reads it without running it again."""
        self.list_status: tuple[int | None, bool | None] = (None, None)
        self.assume_defaults = False
        """Reading with the documented defaults (the environment unset, no command output, no files): only to
        choose the branch an undecidable test takes for the arrays it builds."""
        """The status of the last ``a && b || c`` list walked, by its start byte, read the same way."""

    # ---- bookkeeping

    def step(self, node, cost: int = 1) -> None:
        """Count ``cost`` steps of work done for ``node``; past the budget, stop with ``ShellBudgetError``."""
        self.steps += cost
        if self.steps > self.max_steps:
            raise ShellBudgetError(self.max_steps, self.src.slice(node)[:80], self.src.char(node.start_byte))

    def charger(self, node):
        """What a matcher calls to count its steps against the budget, charged to ``node``."""
        return lambda cost: self.step(node, cost)

    def line(self, node) -> int:
        return node.start_point[0] + 1

    def fail(self, node, message: str) -> ShellError:
        return ShellError(message, self.src.slice(node)[:200], self.src.char(node.start_byte))

    @staticmethod
    def _add(names: list[str], name: str) -> None:
        if name not in names:
            names.append(name)

    @property
    def uncertain(self) -> bool:
        return bool(self.condition)

"""What reading a script yields (commands, words, what is not known) and the limits on the work it costs."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_STEPS = 200_000
"""The default step budget: syntax nodes visited, loop iterations, function calls and matcher steps (one
character against the live states of a pattern) together; a bound on the work one script costs."""
MAX_WORDS = 10_000
"""Words one brace expansion or one array may produce."""
MAX_VALUE_CHARS = 1_000_000
MAX_CALL_DEPTH = 32
MAX_LOOP_ITERATIONS = 1_000



# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Segment:
    """A run of a word's text: literal, or ``verbatim`` (its value is not known here; kept as written)."""

    text: str
    verbatim: bool = False


@dataclass(frozen=True)
class Word:
    """One word of a command after expansion, with the source text it came from and where that starts."""

    text: str
    raw: str
    position: int
    segments: tuple[Segment, ...] = ()

    @property
    def verbatim(self) -> bool:
        """True when some part of the word is not known here."""
        return any(s.verbatim for s in self.segments)

    @property
    def all_verbatim(self) -> bool:
        return bool(self.segments) and all(s.verbatim for s in self.segments)


@dataclass(frozen=True)
class Command:
    """A simple command bash would run: its words (the first is the command's name), its ``NAME=value``
    prefixes, the source text, and why it may not run or may run more than once."""

    words: tuple[Word, ...]
    assignments: tuple[tuple[str, Word], ...]
    raw: str
    position: int
    line: int
    condition: str | None = None
    """The test it depends on when that test cannot be decided here (``[ "$1" = x ]``)."""
    repeated: str | None = None
    """The loop it runs in, when the loop runs it more than once or an unknown number of times."""

    @property
    def name(self) -> str:
        return self.words[0].text if self.words else ""


@dataclass
class Script:
    """What ``read_script`` found: the commands, and every value it could not know."""

    commands: list[Command] = field(default_factory=list)
    environment: list[str] = field(default_factory=list)
    """Variables read but never assigned by the script: kept verbatim (``$HOME``)."""
    defaults: list[str] = field(default_factory=list)
    """Variables from the environment read as ``${X:-default}``, and the script's arguments read as
    ``${1:-default}`` (written ``$1``): the script's default is used."""
    arguments: list[str] = field(default_factory=list)
    """The script's own arguments where they are read (``$1``, ``"$@"``): kept verbatim."""
    substitutions: list[str] = field(default_factory=list)
    """Command substitutions kept verbatim (``$(date +%Y%m%d)``): their output is not known here."""
    notes: list[str] = field(default_factory=list)
    """Other places where the reading is approximate, each with its line."""

    def note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < 100:
            self.notes.append(text)


class ShellError(ValueError):
    """A script that cannot be read: the message, the offending token and its character position."""

    def __init__(self, message: str, token: str, position: int):
        self.message, self.token, self.position = message, token, position
        super().__init__(f"{message} (at character {position}: {token[:80]!r})")



class ShellBudgetError(ShellError):
    """The script costs more than the step budget to read (``budget``: the steps allowed)."""

    def __init__(self, budget: int, token: str, position: int):
        self.budget = budget
        super().__init__(f"the script takes more than {budget} steps to read (the import's step budget: a loop too "
                         "long, or a pattern too costly on a long value?)", token, position)

"""Picking the verl command out of a script read as bash reads it, and importing its overrides."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from worker.interop.shell import MAX_STEPS, Command, Script, ShellBudgetError, ShellError, Word, read_script
from worker.interop.verl.apply import _apply, _check_size, _finish, _State
from worker.interop.verl.hydra import _PLACEHOLDER_WORDS, _parse_override_words
from worker.interop.verl.results import (
    ARGUMENTS_WARNING,
    ENTRY_MESSAGE,
    NO_COMMAND_MESSAGE,
    VERL_MODULE,
    VERL_SCRIPTS,
    ImportBudgetError,
    ImportResult,
    VerlImportError,
)

_WRAPPERS = {"env", "nohup", "exec", "time", "command", "stdbuf", "numactl", "taskset", "srun", "nice", "ionice"}
_INTERPRETER = re.compile(r"^(?:.*/)?python(?:\d+(?:\.\d+)?)?$")
_LAUNCHERS = {"torchrun"}
_PY_FLAGS = re.compile(r"^-[BOuIsSEqd]+$")
_TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path", "--module", "--redirects"}


@dataclass(frozen=True)
class _Entry:
    """Where a python command's own arguments start, and what it runs."""

    name: str
    """The module (after -m) or the script path."""
    args: int
    """Index of the first argument given to the module or script."""

    @property
    def is_main_ppo(self) -> bool:
        return self.name == VERL_MODULE or self.name.rsplit("/", 1)[-1] in VERL_SCRIPTS

    @property
    def is_verl(self) -> bool:
        base = self.name.rsplit("/", 1)[-1]
        return (self.name.startswith(("verl.", "recipe.", "verl/", "recipe/")) or "/verl/" in self.name
                or "/recipe/" in self.name or base.startswith("main_"))


def _entry(command: Command) -> _Entry | None:
    """The module or script a command runs with python (through env, nohup, torchrun, ray job submit ...)."""
    words = [w.text for w in command.words]
    i = 0
    while i < len(words):
        w = words[i]
        if w in _WRAPPERS:
            i += 1
            while i < len(words) and (words[i].startswith("-") or (w == "env" and "=" in words[i])):
                # `srun -N 2 --ntasks 16 python3 ...`: an option's value may be the next word
                value = w != "env" and "=" not in words[i] and i + 1 < len(words) and \
                    not words[i + 1].startswith("-") and not _runs_something(words[i + 1])
                i += 2 if value else 1
            if w == "taskset" and i < len(words):
                i += 1
            continue
        if w == "ray" and words[i + 1:i + 3] == ["job", "submit"] and "--" in words[i:]:
            i = words.index("--", i) + 1
            continue
        if w in ("uv", "conda", "poetry") and i + 1 < len(words) and words[i + 1] == "run":
            i += 2
            while i < len(words) and words[i].startswith("-"):
                i += 1
            continue
        break
    if i >= len(words):
        return None
    first = command.words[i]
    launcher = words[i] in _LAUNCHERS
    if not (_INTERPRETER.match(words[i]) or launcher or (first.all_verbatim and "-m" in words[i + 1:i + 3])):
        return None
    i += 1
    while i < len(words):
        w = words[i]
        if w in ("-m", "--module") or (launcher and w == "-m"):
            return _Entry(words[i + 1], i + 2) if i + 1 < len(words) else None
        if w in ("-X", "-W") and not launcher:
            i += 2
        elif not launcher and _PY_FLAGS.match(w):
            i += 1
        elif launcher and w.startswith("-"):
            i += 1 if ("=" in w or w in _TORCHRUN_FLAGS) else 2
        elif w == "-c":
            return None
        else:
            if w in ("torch.distributed.run", "torch.distributed.launch"):
                return None
            return _Entry(w, i + 1)
    return None


def _runs_something(word: str) -> bool:
    """A word that starts what a wrapper runs (an interpreter, a launcher, another wrapper), not an option's value."""
    return bool(_INTERPRETER.match(word)) or word in _LAUNCHERS or word in _WRAPPERS or \
        word in ("ray", "uv", "conda", "poetry", "bash", "sh")


def _looks_like_overrides(command: Command) -> bool:
    return all("=" in w.text or w.text.startswith(("~", "[", "<")) or w.text.endswith(("]", ">"))
               or w.text in _PLACEHOLDER_WORDS or w.all_verbatim for w in command.words)


def _verl_words(script: Script, state: _State) -> list[Word]:
    """The words of the script's verl command after its entry point (or of a bare list of overrides),
    with a warning for every part of the script that is not read or not known."""
    entries = [(c, _entry(c)) for c in script.commands]
    mains = [(c, e) for c, e in entries if e is not None and e.is_main_ppo]
    if not mains:
        other = next(((c, e) for c, e in entries if e is not None and e.is_verl), None)
        if other is not None:
            command, entry = other
            word = command.words[entry.args - 1]
            raise VerlImportError(ENTRY_MESSAGE.format(entry=entry.name), word.raw, word.position)
        if script.commands and all(_looks_like_overrides(c) for c in script.commands):
            _shell_warnings(script, state, {id(c) for c in script.commands})
            return [w for c in script.commands for w in c.words]
        python = next(((c, e) for c, e in entries if e is not None and any("=" in w.text for w in c.words[e.args:])),
                      None)
        if python is not None:
            command, entry = python
            word = command.words[entry.args - 1]
            raise VerlImportError(ENTRY_MESSAGE.format(entry=entry.name), word.raw, word.position)
        first = script.commands[0].words[0] if script.commands else Word("", "", 0)
        raise VerlImportError(NO_COMMAND_MESSAGE, first.raw or script_text_head(script), first.position)
    if len(mains) > 1:
        lines = ", ".join(str(c.line) for c, _ in mains)
        command = mains[1][0]
        loop = f" (the loop `{command.repeated}` runs it each time)" if command.repeated else ""
        raise VerlImportError(f"the script runs verl.trainer.main_ppo {len(mains)} times, on lines {lines}{loop}: "
                              "attnboard imports one run; keep the command you mean", command.raw[:80],
                              command.position)
    command, entry = mains[0]
    if command.condition:
        state.warn(f"the verl command (line {command.line}) runs only when `{command.condition}`, which the "
                   "import cannot decide")
    if command.repeated:
        state.warn(f"the verl command (line {command.line}) runs in the loop `{command.repeated}`: the values "
                   "imported are those of one pass")
    for name, _ in command.assignments:
        state.warn(f"ignored: environment variable {name}")
    _shell_warnings(script, state, {id(command)})
    return list(command.words[entry.args:])


def script_text_head(script: Script) -> str:
    return script.commands[0].raw[:40] if script.commands else ""


def _shell_warnings(script: Script, state: _State, used: set[int]) -> None:
    stray = [c for c in script.commands if id(c) not in used and c.words and "=" in c.name and _looks_like_overrides(c)]
    for command in stray:
        state.warn(f"line {command.line}: {command.raw[:80]} is a command of its own for bash (a backslash lost at "
                   "the end of the line before?): verl does not get it, nor does the import")
    ignored = [c.name for c in script.commands if id(c) not in used and c.name and c not in stray]
    if ignored:
        state.warn("ignored shell commands (not the verl command): " + ", ".join(dict.fromkeys(ignored)))
    if script.environment:
        state.warn("from the environment, kept verbatim: " + ", ".join(script.environment))
    from_env = [name for name in script.defaults if not name.startswith("$")]
    arguments = [name for name in script.defaults if name.startswith("$")]
    if from_env:
        state.warn("from the environment, not set here, so the script's default is used: " + ", ".join(from_env))
    if arguments:
        state.warn("the script's arguments, not given here, so the script's default is used: " + ", ".join(arguments))
    if script.substitutions:
        state.warn("command output, not known here, kept verbatim: " + ", ".join(script.substitutions))
    for note in script.notes:
        state.warn(note)


def _shell_overrides(words: list[Word], state: _State) -> list[Word]:
    """Words with parts not known here: the script's arguments (``"$@"``) and values from the environment
    that hold whole words are left out with a warning; other unknown parts stay in the value, as written."""
    out: list[Word] = []
    for word in words:
        if word.all_verbatim and word.text.startswith(("$@", "$*", "${@", "${*")):
            state.warn(ARGUMENTS_WARNING.format(word=word.text))
            continue
        if word.all_verbatim and "=" not in word.text:
            state.warn(f"ignored: {word.text} (its value is not known here: the overrides it holds are not imported)")
            continue
        out.append(word)
    return out



def import_command(text: str, *, max_steps: int = MAX_STEPS, environment: Mapping[str, str] | None = None) -> ImportResult:
    """A verl launch script, command line or bare list of ``key=value`` overrides -> a spec and its warnings.

    The text is read as bash reads it (``worker.interop.shell``); the ``python3 -m verl.trainer.main_ppo``
    command's arguments are the overrides, every other command is ignored. Reading the script may cost at
    most ``max_steps`` steps (``worker.interop.shell.MAX_STEPS`` by default): past that, ``ImportBudgetError``
    naming the budget. ``environment``: values of variables the script reads from its environment (a key
    whose number only SLURM knows, listed in ``ImportResult.asks``, is given this way)."""
    _check_size(text)
    state = _State()
    try:
        script = read_script(text, max_steps=max_steps, environment=environment)
    except ShellBudgetError as exc:
        raise ImportBudgetError(exc.message, exc.token, exc.position, exc.budget) from None
    except ShellError as exc:
        raise VerlImportError(exc.message, exc.token, exc.position) from None
    words = _shell_overrides(_verl_words(script, state), state)
    for override in _parse_override_words(words, state.warnings):
        _apply(state, override, command_line=True)
    return _finish(state, text)


"""verl interop: a verl launch script, command line or YAML in, a RunSpec out, and back again.

Pure logic, no I/O. Three layers, each undone exactly by its inverse on export:

1. the shell: the text is read as bash reads it (``worker.interop.shell``: variables, ``${VAR:-default}``,
   arrays, ``$((...))``, quotes, continuations, pipes, ``if``/``for``); the ``python3 -m
   verl.trainer.main_ppo`` command's arguments are the overrides, every other command is ignored, and
   what cannot be known without running the script (the environment, ``$@``, ``$(date)``) is listed;
2. Hydra's override grammar: ``key=value``, ``+key=value`` (add), ``++key=value`` (add or replace),
   ``~key`` (delete), values typed as Hydra types them (null, bools, ints, floats, quoted strings,
   ``[lists]``, ``{dicts}``);
3. OmegaConf interpolations: ``${key}`` and ``${oc.select:key,default}``, resolved against the
   imported config; ``\\${`` is a literal ``${``.

Keys are checked against the spec (``worker.spec``) and against verl 0.9.1's generated default config
(``worker.spec.verl_defaults``): a key verl has but attnboard does not model is kept in the spec's
``verl_passthrough`` (passed through to verl, not run by attnboard) and exported unchanged, as is a key
given with ``+`` that verl's config lacks; a key neither knows, given without ``+``, is an error
suggesting the nearest valid key. Hydra's struct mode decides the ``+``: keys present in verl's default
config are written bare, keys that are not (every ``override_config`` sub-key, every ``attnboard.*``
key, every ``+`` pass-through key) need ``+``.
"""

from __future__ import annotations

import math
import re
import shlex
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from worker.interop.shell import Command, Script, ShellError, Word, read_script
from worker.spec import (
    ALIASES,
    DEFAULT_LOCAL_DIR,
    OPEN_DICT_FIELDS,
    PASSTHROUGH,
    PASSTHROUGH_NOTE,
    SPEC_KEYS,
    SPEC_NAMES,
    VERL_NAMES,
    RunSpec,
    SpecError,
    classify_key,
    flatten,
    nearest_key,
    nearest_verl_key,
    needs_plus,
    parse_spec,
    typed_like_verl,
    unflatten,
)
from worker.spec.engines import (
    ENGINE_STRATEGY,
    MODEL_ENGINE_KEY,
    RETIRED_CONFIGS,
    ModelEngine,
    group_message,
    key_outside_engine,
    retired_message,
)
from worker.spec.verl_defaults import MANDATORY, VERL_DEFAULTS, VERL_VERSION

MAX_INPUT_BYTES = 1_000_000
"""Largest command line or YAML document accepted."""
MAX_YAML_NODES = 20_000
"""Largest YAML document, counted in values after aliases are expanded (billion-laughs guard)."""
MAX_YAML_DEPTH = 64
MAX_INTERPOLATION_DEPTH = 10

DEFAULT_ENTRYPOINT = "python3 -m verl.trainer.main_ppo"
VERL_MODULE = "verl.trainer.main_ppo"
VERL_SCRIPTS = ("main_ppo.py", "ppo_trainer.py")

# Warnings: short exact sentences, asserted in tests.
CRITIC_ATTN_WARNING = (
    "verl <= 0.9.1 ignores critic.model.override_config.attn_implementation (verl issue #5210): "
    "load_valuehead_model passes flash_attention_2 explicitly; attnboard honours it"
)
ATTNBOARD_KEYS_WARNING = "attnboard-only keys are passed with + and ignored by verl"
HF_ROLLOUT_WARNING = (
    "verl 0.9.1 has no hf rollout engine (only vllm, sglang, trtllm) and stops with "
    "'Rollout hf with mode async not found'; attnboard generates with the actor's HF model"
)


def engine_rollout_warning(name: str) -> str:
    return (
        f"verl's {name} rollout engine picks its own attention kernel; attnboard generates with the "
        "actor's HF model and its attn_implementation"
    )


# --------------------------------------------------------------------------------------------
# Results and errors

_NON_SPACE = re.compile(r"\S*")


def _word_end(text: str, at: int) -> int:
    match = _NON_SPACE.match(text, at)
    return match.end() if match else at + 1



@dataclass(frozen=True)
class ImportResult:
    spec: RunSpec
    warnings: list[str]
    overrides: dict[str, Any]
    """The dotted keys given that attnboard models (aliases rewritten), with their parsed values."""


@dataclass(frozen=True)
class ExportResult:
    text: str
    warnings: list[str]


class VerlImportError(ValueError):
    """A command line or YAML that cannot be imported: the message, the offending token and its
    character position in the original text; ``issues`` holds the spec issues when the values were
    the problem."""

    def __init__(self, message: str, token: str, position: int, issues: list[Any] | None = None):
        self.message = message
        self.token = token
        self.position = position
        self.issues = issues or []
        shown = token if len(token) <= 80 else token[:77] + "..."
        super().__init__(f"{message} (at character {position}: {shown!r})")


# --------------------------------------------------------------------------------------------
# Layer 1: the shell (``worker.interop.shell`` reads the script as bash would; here, the verl command is picked)


MEGATRON_MESSAGE = (
    "{what} without model_engine={engine}: verl {version} chooses its {engine} engine with the model_engine config "
    "group (the strategy alone keeps dp's FSDP sections); add model_engine={engine}"
)
RETIRED_CONFIG_WARNING = (
    "--config-name={name} is retired in verl {version} (the file says \"[Deprecated] ... please use ppo_trainer.yaml "
    "instead\"): read as ppo_trainer with model_engine={engine}"
)
ENTRY_MESSAGE = (
    "entry point {entry} is not supported: attnboard imports verl.trainer.main_ppo commands (verl's PPO trainer "
    "with its ppo_trainer config); recipes such as DAPO and one-step-off-policy run trainers of their own"
)
NO_COMMAND_MESSAGE = (
    "no verl command found: expected `python3 -m verl.trainer.main_ppo key=value ...` (or torchrun ... -m "
    "verl.trainer.main_ppo, python3 path/main_ppo.py), or a list of key=value overrides"
)
ARGUMENTS_WARNING = "ignored: {word} (the arguments of the script it came from)"
PPO_CONFIG_NAMES = ("ppo_trainer", "ppo_trainer.yaml")

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
                i += 1
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
    if script.defaults:
        state.warn("from the environment, not set here, so the script's default is used: " + ", ".join(script.defaults))
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


# --------------------------------------------------------------------------------------------
# Layer 3 (used by layer 2 and YAML): OmegaConf interpolations


@dataclass(frozen=True)
class Interpolation:
    """A string with unescaped ``${...}``: literal parts and references, in order."""

    parts: tuple[str | tuple[str], ...]
    """Literal strings and 1-tuples holding the text inside ``${...}``."""

    def text(self) -> str:
        return "".join(p if isinstance(p, str) else "${" + p[0] + "}" for p in self.parts)


def decode_omegaconf(s: str) -> str | Interpolation:
    """OmegaConf's reading of a string: ``${ref}`` is an interpolation, ``\\${`` a literal ``${``, and
    ``\\\\${`` a backslash followed by an interpolation. Raises ValueError on an unclosed ``${``."""
    if "${" not in s:
        return s
    parts: list[str | tuple[str]] = []
    literal: list[str] = []
    i = 0
    while i < len(s):
        if s[i] == "\\":
            j = i
            while j < len(s) and s[j] == "\\":
                j += 1
            run = j - i
            if s.startswith("${", j):
                literal.append("\\" * (run // 2))
                if run % 2:
                    literal.append("${")
                    i = j + 2
                else:
                    i = j
                continue
            literal.append(s[i:j])
            i = j
        elif s.startswith("${", i):
            close = s.find("}", i + 2)
            if close < 0:
                raise ValueError(f"unclosed interpolation in {s!r}")
            ref = s[i + 2 : close]
            if "${" in ref:
                raise ValueError(f"nested interpolation {s[i:close + 1]!r} is not supported")
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append((ref.strip(),))
            i = close + 1
        else:
            literal.append(s[i])
            i += 1
    if literal:
        parts.append("".join(literal))
    if all(isinstance(p, str) for p in parts):
        return "".join(p for p in parts if isinstance(p, str))
    return Interpolation(tuple(parts))


def encode_omegaconf(s: str) -> str:
    """The inverse of ``decode_omegaconf`` for a literal string: every ``${`` escaped."""
    if "${" not in s:
        return s
    return re.sub(r"(\\*)\$\{", lambda m: "\\" * (2 * len(m.group(1)) + 1) + "${", s)


# --------------------------------------------------------------------------------------------
# Layer 2: Hydra overrides


Op = Literal["set", "add", "force", "delete"]


@dataclass
class Override:
    op: Op
    key: str
    value: Any
    raw_value: str | None
    """The value's source text, kept for string fields given a number (``trainer.project_name=2024``)."""
    word: Word


_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(?:\.[A-Za-z0-9_\-]+)*$")
_INT = re.compile(r"^[+-]?(?:0|[1-9](?:_?[0-9])*)$")
_FLOAT = re.compile(
    r"^[+-]?(?:(?:(?:0|[1-9](?:_?[0-9])*)?\.[0-9](?:_?[0-9])*|(?:0|[1-9](?:_?[0-9])*)\.)(?:[eE][+-]?[0-9](?:_?[0-9])*)?"
    r"|(?:0|[1-9](?:_?[0-9])*)[eE][+-]?[0-9](?:_?[0-9])*|inf|nan)$",
    re.IGNORECASE,
)
_UNQUOTED_ESCAPES = "\\()[]{}:=, \t"
_PLACEHOLDER_WORDS = ("...", "\u2026")


class _HydraSyntaxError(Exception):
    pass


class _HydraValue:
    """A recursive-descent reader for one Hydra override value."""

    def __init__(self, text: str):
        self.s = text
        self.i = 0

    def parse(self) -> Any:
        if not self.s.strip():
            return ""
        value = self.element(top=True)
        self.skip_ws()
        if self.i < len(self.s):
            if self.s[self.i] == ",":
                raise _HydraSyntaxError("a comma outside brackets makes a Hydra sweep; quote the value or write a list [a,b]")
            raise _HydraSyntaxError(f"unexpected {self.s[self.i]!r} after the value")
        return value

    def skip_ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def element(self, top: bool = False, stop: str = ",]}") -> Any:
        self.skip_ws()
        if self.i >= len(self.s):
            raise _HydraSyntaxError("a value is missing")
        ch = self.s[self.i]
        if ch == "[":
            return self.sequence()
        if ch == "{":
            return self.mapping()
        if ch in "'\"":
            value = self.quoted(ch)
            self.skip_ws()
            if self.i < len(self.s) and self.s[self.i] not in ("," if top else stop):
                raise _HydraSyntaxError("a quoted string must be the whole value")
            return value
        return self.primitive("" if top else stop)

    def sequence(self) -> list[Any]:
        self.i += 1
        items: list[Any] = []
        self.skip_ws()
        if self.s.startswith("]", self.i):
            self.i += 1
            return items
        while True:
            items.append(self.element())
            self.skip_ws()
            if self.s.startswith(",", self.i):
                self.i += 1
            elif self.s.startswith("]", self.i):
                self.i += 1
                return items
            else:
                raise _HydraSyntaxError("unbalanced [: expected , or ]")

    def mapping(self) -> dict[str, Any]:
        self.i += 1
        items: dict[str, Any] = {}
        self.skip_ws()
        if self.s.startswith("}", self.i):
            self.i += 1
            return items
        while True:
            self.skip_ws()
            key = self.quoted(self.s[self.i]) if self.s[self.i : self.i + 1] in ("'", '"') else self.primitive(":,]}")
            self.skip_ws()
            if not self.s.startswith(":", self.i):
                raise _HydraSyntaxError("a {dict} entry needs key:value")
            self.i += 1
            items[str(key)] = self.element()
            self.skip_ws()
            if self.s.startswith(",", self.i):
                self.i += 1
            elif self.s.startswith("}", self.i):
                self.i += 1
                return items
            else:
                raise _HydraSyntaxError("unbalanced {: expected , or }")

    def quoted(self, quote: str) -> str | Interpolation:
        """Hydra's quoted strings: a run of backslashes before a quote is halved (odd: the quote is
        literal); every other backslash is kept."""
        self.i += 1
        out: list[str] = []
        while True:
            if self.i >= len(self.s):
                raise _HydraSyntaxError(f"unbalanced quote: no closing {quote}")
            ch = self.s[self.i]
            if ch == "\\":
                j = self.i
                while j < len(self.s) and self.s[j] == "\\":
                    j += 1
                run = j - self.i
                if j < len(self.s) and self.s[j] == quote:
                    out.append("\\" * (run // 2))
                    if run % 2:
                        out.append(quote)
                        self.i = j + 1
                    else:
                        self.i = j
                    continue
                out.append(self.s[self.i : j])
                self.i = j
            elif ch == quote:
                self.i += 1
                try:
                    return decode_omegaconf("".join(out))
                except ValueError as exc:
                    raise _HydraSyntaxError(str(exc)) from None
            else:
                out.append(ch)
                self.i += 1

    def primitive(self, stop: str) -> Any:
        out: list[str] = []
        while self.i < len(self.s):
            ch = self.s[self.i]
            if ch == "\\" and self.i + 1 < len(self.s) and self.s[self.i + 1] in _UNQUOTED_ESCAPES:
                out.append(self.s[self.i + 1] if self.s[self.i + 1] != "\\" else "\\")
                self.i += 2
                continue
            if ch in stop or (ch == "," and not stop):
                break
            if ch in "[{":
                raise _HydraSyntaxError(f"unexpected {ch!r} inside an unquoted value; quote the value")
            if ch == "$" and self.s.startswith("${", self.i):
                close = self.s.find("}", self.i)
                if close < 0:
                    raise _HydraSyntaxError("unclosed interpolation ${")
                out.append(self.s[self.i : close + 1])
                self.i = close + 1
                continue
            if ch in "()":
                raise _HydraSyntaxError("Hydra functions such as choice(...) or range(...) are not supported")
            if ch in "'\"":
                raise _HydraSyntaxError("a quote inside an unquoted value; quote the whole value")
            out.append(ch)
            self.i += 1
        text = "".join(out).strip(" \t")
        return _typed_primitive(text)


def _typed_primitive(text: str) -> Any:
    lowered = text.lower()
    if lowered == "null":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if _INT.match(text):
        return int(text.replace("_", ""))
    if _FLOAT.match(text):
        return float(text.replace("_", ""))
    try:
        return decode_omegaconf(text)
    except ValueError as exc:
        raise _HydraSyntaxError(str(exc)) from None


def parse_hydra_value(text: str) -> Any:
    """A Hydra override value as Hydra types it. Raises ValueError with a sentence on bad syntax."""
    try:
        return _HydraValue(text).parse()
    except _HydraSyntaxError as exc:
        raise ValueError(str(exc)) from None


_STRATEGY_KEYS = ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy",
                  "reward_model.strategy")


def _protect(word: Word) -> tuple[str, dict[str, str]]:
    """A word's text with each part not known here replaced by a token Hydra reads as plain characters
    (private-use code points the text does not hold), and the tokens' original texts."""
    mark = next(chr(c) for c in range(0xE000, 0xF900) if chr(c) not in word.text)
    text: list[str] = []
    tokens: dict[str, str] = {}
    for segment in word.segments:
        if segment.verbatim:
            token = f"{mark}{len(tokens)}{mark}"
            tokens[token] = segment.text
            text.append(token)
        else:
            text.append(segment.text)
    return "".join(text), tokens


def _restore(value: Any, tokens: dict[str, str]) -> Any:
    if not tokens:
        return value
    if isinstance(value, str):
        for token, original in tokens.items():
            value = value.replace(token, original)
        return value
    if isinstance(value, list):
        return [_restore(v, tokens) for v in value]
    if isinstance(value, dict):
        return {_restore(k, tokens): _restore(v, tokens) for k, v in value.items()}
    if isinstance(value, Interpolation):
        return Interpolation(tuple(_restore(p, tokens) if isinstance(p, str) else (_restore(p[0], tokens),)
                                   for p in value.parts))
    return value


def _hydra_option(text: str, words: list[Word], k: int, word: Word, warnings: list[str],
                  overrides: list[Override]) -> int:
    """A ``--option`` on verl's command line: Hydra's config options are checked (only verl's
    ppo_trainer config is read, and the retired ``ppo_megatron_trainer``, which is ppo_trainer with
    ``model_engine=megatron``), the others refused. Returns the index of the next word."""
    name, eq, value = text.partition("=")
    if name in ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd"):
        if not eq and k < len(words):
            value = words[k].text
            k += 1
        if name in ("--config-name", "-cn"):
            base = value.rsplit("/", 1)[-1].removesuffix(".yaml")
            if base in RETIRED_CONFIGS:
                engine = RETIRED_CONFIGS[base]
                warnings.append(RETIRED_CONFIG_WARNING.format(name=value, version=VERL_VERSION, engine=engine))
                overrides.append(Override("set", MODEL_ENGINE_KEY, engine, engine, word))
                return k
            if base + ".yaml" not in PPO_CONFIG_NAMES:
                raise VerlImportError(
                    f"{name}={value}: a config of your own is a file the import does not read; import that YAML "
                    "file itself, or give its keys on the command line", word.raw, word.position)
        warnings.append(f"ignored: Hydra option {name}; keys are read against verl's ppo_trainer defaults")
        return k
    if name in ("--multirun", "-m"):
        warnings.append(f"ignored: Hydra option {name}")
        return k
    raise VerlImportError(f"unknown option {name}: expected key=value overrides", word.raw, word.position)


def _parse_override_words(words: list[Word], warnings: list[str]) -> list[Override]:
    overrides: list[Override] = []
    k = 0
    while k < len(words):
        word = words[k]
        text, tokens = _protect(word) if word.verbatim else (word.text, {})
        k += 1
        if text in _PLACEHOLDER_WORDS or (text.startswith(("[", "<")) and "=" not in text):
            parts = [word.raw]
            closer = "]" if text.startswith("[") else ">"
            while not parts[-1].endswith(closer) and k < len(words) and "=" not in words[k].text:
                parts.append(words[k].raw)
                k += 1
            warnings.append(f"skipped placeholder {' '.join(dict.fromkeys(parts))}")
            continue
        if text.startswith("-"):
            k = _hydra_option(word.text, words, k, word, warnings, overrides)
            continue
        op: Op
        if text.startswith("~"):
            op, body = "delete", text[1:]
        elif text.startswith("++"):
            op, body = "force", text[2:]
        elif text.startswith("+"):
            op, body = "add", text[1:]
        else:
            op, body = "set", text
        key, eq, raw_value = body.partition("=")
        if not eq and op != "delete":
            raise VerlImportError(f"expected key=value, got {word.text!r}: '=' is missing", word.raw, word.position)
        if any(token in key for token in tokens):
            raise VerlImportError(f"the key of {word.text!r} is not known here (it holds a value from outside the "
                                  "script)", word.raw, word.position)
        if "@" in key:
            raise VerlImportError(f"Hydra package overrides ({key}) are not supported", word.raw, word.position)
        if not _KEY.match(key):
            raise VerlImportError(f"invalid key {key!r}: expected dotted names such as data.train_batch_size",
                                  word.raw, word.position)
        value: Any = None
        if eq:
            try:
                value = _restore(parse_hydra_value(raw_value), tokens)
            except ValueError as exc:
                raise VerlImportError(f"{key}: {_restore(str(exc), tokens)}", word.raw, word.position) from None
        overrides.append(Override(op, key, value, _restore(raw_value, tokens) if eq else None, word))
    return overrides


# --------------------------------------------------------------------------------------------
# Applying overrides: the part shared by the command line and YAML


def _field_annotations(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(_field_annotations(ann, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = ann
    return out


def _holds_str(annotation: Any) -> bool:
    """Whether a field takes a string (``str``, ``str | None``, ``Annotated[str, ...] | list[...]``)."""
    if annotation is str:
        return True
    if typing.get_origin(annotation) is typing.Annotated:
        return _holds_str(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_holds_str(a) for a in typing.get_args(annotation))
    return False


_ANNOTATIONS = _field_annotations(RunSpec)
_STRING_KEYS = frozenset(k for k, ann in _ANNOTATIONS.items() if _holds_str(ann))


def _spec_tree(spec: RunSpec) -> dict[str, Any]:
    # Python mode, not JSON: JSON mode turns an override_config float inf into null.
    tree = spec.model_dump()
    tree.pop(PASSTHROUGH, None)
    return tree


def _spec_flat(spec: RunSpec) -> dict[str, Any]:
    return flatten(_spec_tree(spec))


_SPEC_DEFAULTS = _spec_flat(RunSpec())

KEPT_INTERPOLATIONS: dict[str, str] = {"trainer.default_local_dir": DEFAULT_LOCAL_DIR}
"""verl defaults that are interpolations and that the spec keeps as text, resolved when the engine uses
them (``worker.engine.checkpoint.checkpoint_folder``): the import leaves the exact default unresolved, the export
writes it unescaped, so verl reads it as its own default and a spec at verl's defaults round-trips."""


def _unknown_key_message(key: str) -> str:
    retired = retired_message(key) or group_message(key)
    if retired:
        return f"unknown key {key}: {retired}"
    near = nearest_key(key) or nearest_verl_key(key)
    hint = f"; did you mean {near}?" if near else ""
    return (f"unknown key {key}: neither attnboard nor verl {VERL_VERSION} has it{hint} (write +{key}=... to add "
            "a key verl's config lacks)")


@dataclass
class _Given:
    value: Any
    raw: str | None
    word: Word


@dataclass
class _State:
    given: dict[str, _Given] = field(default_factory=dict)
    """Modelled keys (override_config sub-keys dotted in full), in the order given."""
    passthrough: dict[str, _Given] = field(default_factory=dict)
    """Keys of verl's config that attnboard does not model (and ``+`` keys verl's config lacks, with their
    ``+``): passed through to verl, not run by attnboard."""
    warnings: list[str] = field(default_factory=list)
    engine_strategies: dict[str, tuple[str, Word]] = field(default_factory=dict)
    """``strategy`` keys set to a non-dp engine's own strategy (``megatron``): checked against ``model_engine``."""
    added_plus: set[str] = field(default_factory=set)
    """Pass-through keys a command line added with ``+`` that some engine's config has: Hydra rejects the ``+``
    under an engine whose config has the key."""
    set_bare: set[str] = field(default_factory=set)
    """Pass-through keys a command line set without ``+``: Hydra refuses those the chosen engine's config lacks."""

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)


def _assign(table: dict[str, _Given], key: str, given: _Given) -> None:
    bare = key.lstrip("+")
    for other in list(table):
        other_bare = other.lstrip("+")
        if other_bare.startswith(bare + ".") or (bare.startswith(other_bare + ".") and not isinstance(table[other].value, dict)):
            del table[other]
    table.pop("+" + bare, None)
    table.pop(bare, None)
    table[key] = given


def _delete(table: dict[str, _Given], key: str) -> bool:
    found = False
    for other in list(table):
        bare = other.lstrip("+")
        if bare == key or bare.startswith(key + "."):
            del table[other]
            found = True
    return found


def _apply(state: _State, override: Override, *, command_line: bool) -> None:
    key = override.key
    if key in ALIASES:
        state.warn(f"{key} is deprecated in verl; read as {ALIASES[key]}")
        key = ALIASES[key]
    key = SPEC_NAMES.get(key, key)
    kind = classify_key(key)
    given = _Given(override.value, override.raw_value, override.word)
    if key in _STRATEGY_KEYS and override.value in ENGINE_STRATEGY.values():
        state.engine_strategies[key] = (override.value, override.word)
        return
    if kind == "section":
        if override.op == "delete":
            for table in (state.given, state.passthrough):
                _delete(table, key)
            state.warn(f"~{override.key}: reset to attnboard's and verl's defaults")
            return
        if not isinstance(override.value, dict):
            example = next(k for k in (*SPEC_KEYS, *VERL_DEFAULTS) if k.startswith(key + "."))
            raise VerlImportError(f"{key} is a section, not a value: give one of its keys, e.g. {example}",
                                  override.word.raw, override.word.position)
        for sub, value in override.value.items():
            _apply(state, Override(override.op, f"{key}.{sub}", value, None, override.word), command_line=command_line)
        return
    if kind == "under_value":
        parent = key.rsplit(".", 1)[0]
        raise VerlImportError(f"{key}: {parent} holds a value in verl's config, not a section",
                              override.word.raw, override.word.position)
    if kind == "unknown" and (key.split(".", 1)[0] == "attnboard" or (override.op == "set" and command_line)):
        raise VerlImportError(_unknown_key_message(key), override.word.raw, override.word.position)
    if kind == "unknown" and not command_line:
        near = nearest_key(key) or nearest_verl_key(key)
        state.warn(f"{key} is not in verl {VERL_VERSION}'s config: a config file adds it (passed through as "
                   f"+{key}){f'; did you mean {near}?' if near else ''}")
    if kind in ("verl", "hydra", "unknown"):
        stored = ("+" if needs_plus(key) else "") + key
        if command_line and override.op == "add" and not needs_plus(key):
            state.added_plus.add(key)  # whether verl rejects the + depends on model_engine: checked at the end
        if command_line and override.op == "set" and needs_plus(key):
            state.warn(f"verl needs +{key}: the key is not in its default config; the export adds the +")
        if override.op == "delete":
            if not _delete(state.passthrough, key):
                state.warn(f"~{key}: verl deletes the key from its config; attnboard keeps no record of it")
            return
        if kind == "verl":
            given = _Given(typed_like_verl(key, override.value, override.raw_value), override.raw_value,
                           override.word)
            if command_line and override.op == "set":
                state.set_bare.add(key)
        _assign(state.passthrough, stored, given)
        return
    if command_line:
        in_verl = not needs_plus(override.key)
        if override.op == "set" and not in_verl:
            state.warn(f"verl needs +{key}: the key is not in its default config; the export adds the +")
        if override.op == "add" and in_verl:
            state.warn(f"verl rejects +{override.key}: the key exists in its default config; "
                       f"write {override.key}= or ++{override.key}=")
    if override.op == "delete":
        _delete(state.given, key)
        state.warn(f"~{override.key}: reset to attnboard's default")
        return
    if key in state.given:
        state.warn(f"{key} is given twice; the last value wins")
    _assign(state.given, key, given)


def _lookup(state: _State, ref: str, key: str) -> Any:
    if ref.startswith("oc.select:"):
        target, _, default_text = ref[len("oc.select:") :].partition(",")
        target, default_text = target.strip(), default_text.strip()
        default: Any = parse_hydra_value(default_text) if default_text else None
        has_default = bool(default_text)
    elif ":" in ref:
        raise KeyError(f"resolver {ref.split(':', 1)[0]} is not supported; attnboard resolves ${{key}} "
                       "and ${oc.select:key,default}")
    else:
        target, default, has_default = ref, None, False
    if target.startswith("."):
        target = key.rsplit(".", 1)[0] + target
    target = ALIASES.get(target, target)
    for table, name in ((state.given, target), (state.passthrough, target), (state.passthrough, "+" + target)):
        if name in table:
            return _kept(target, table[name].value)
    for defaults in (_SPEC_DEFAULTS, VERL_DEFAULTS):
        if target in defaults:
            return _kept(target, defaults[target])
    if has_default or ref.startswith("oc.select:"):
        return default
    raise KeyError(f"${{{ref}}} refers to {target}, which neither the import nor verl's defaults have")


def _kept(key: str, value: Any) -> Any:
    """A kept interpolation (``KEPT_INTERPOLATIONS``) read by another key's interpolation: resolved there."""
    return decode_omegaconf(value) if isinstance(value, str) and KEPT_INTERPOLATIONS.get(key) == value else value


def _resolve(state: _State, key: str, value: Any, depth: int = 0) -> Any:
    if isinstance(value, list):
        return [_resolve(state, key, v, depth) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(state, key, v, depth) for k, v in value.items()}
    if not isinstance(value, Interpolation):
        return value
    if depth >= MAX_INTERPOLATION_DEPTH:
        raise KeyError(f"interpolations nest deeper than {MAX_INTERPOLATION_DEPTH} (a cycle?)")
    resolved = [p if isinstance(p, str) else _resolve(state, key, _lookup(state, p[0], key), depth + 1)
                for p in value.parts]
    if len(resolved) == 1 and not isinstance(value.parts[0], str):
        return resolved[0]
    return "".join(v if isinstance(v, str) else _omegaconf_str(v) for v in resolved)


def _omegaconf_str(value: Any) -> str:
    return "None" if value is None else str(value)


def _resolved(state: _State, table: dict[str, _Given]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, given in table.items():
        if isinstance(given.value, Interpolation) and given.value.text() == KEPT_INTERPOLATIONS.get(key):
            out[key] = KEPT_INTERPOLATIONS[key]
            continue
        try:
            out[key] = _resolve(state, key.lstrip("+"), given.value)
        except (KeyError, ValueError) as exc:
            message = exc.args[0] if exc.args else str(exc)
            raise VerlImportError(f"{key}: {message}", given.word.raw, given.word.position) from None
    return out


def _check_engine_strategies(state: _State, engine: str) -> None:
    """``strategy=megatron`` (veomni, ...) is that engine's own value under its ``model_engine``, where the export
    keeps it through ``model_engine``; without it verl keeps dp's sections (refused, naming the fix)."""
    for key, (value, word) in state.engine_strategies.items():
        if ENGINE_STRATEGY.get(engine) != value:
            engine_name = next(e for e, s in ENGINE_STRATEGY.items() if s == value)
            raise VerlImportError(MEGATRON_MESSAGE.format(what=f"{key}={value}", engine=engine_name, version=VERL_VERSION),
                                  word.raw, word.position)
        state.warn(f"{key}={value} is model_engine={engine}'s own default: kept through model_engine")
    for key in sorted(state.added_plus):
        if not needs_plus(key, engine):
            state.warn(f"verl rejects +{key}: the key exists in its default config; write {key}= or ++{key}=")
    for key in state.set_bare & set(state.passthrough):
        outside = key_outside_engine(key, engine)
        if outside:
            word = state.passthrough[key].word
            raise VerlImportError(outside, word.raw, word.position)


def _finish(state: _State, source_text: str) -> ImportResult:
    flat = _resolved(state, state.given)
    _check_engine_strategies(state, str(flat.get(MODEL_ENGINE_KEY, ModelEngine.dp.value)))
    for key, value in flat.items():
        raw = state.given[key].raw
        if key in _STRING_KEYS and isinstance(value, (bool, int, float)):
            flat[key] = raw.strip() if raw is not None else str(value)
    passthrough = _resolved(state, state.passthrough)
    try:
        spec = parse_spec({**flat, PASSTHROUGH: passthrough} if passthrough else flat)
    except SpecError as exc:
        errors = [i for i in exc.issues if i.severity == "error"] or exc.issues
        first = errors[0]
        word = _word_for(state, first.field) or Word(source_text[:80], source_text[:80], 0)
        message = "; ".join(f"{i.field}: {i.message}" for i in errors)
        if "$" in message and any(isinstance(i.value, str) and "$" in i.value for i in errors):
            message += " (a value from the environment or the script's arguments is not known here)"
        raise VerlImportError(message, word.raw, word.position, issues=errors) from None
    if "attn_implementation" in spec.critic.model.override_config:
        state.warn(CRITIC_ATTN_WARNING)
    if "actor_rollout_ref.rollout.name" in flat:
        name = spec.actor_rollout_ref.rollout.name
        state.warn(HF_ROLLOUT_WARNING if name == "hf" else engine_rollout_warning(name))
    if spec.verl_passthrough:
        state.warn(f"{PASSTHROUGH_NOTE}: {', '.join(spec.verl_passthrough)}")
    for key in spec.verl_passthrough:
        retired = retired_message(key.lstrip("+"))
        if retired:
            state.warn(retired)
    return ImportResult(spec=spec, warnings=state.warnings, overrides=flat)


def _word_for(state: _State, field_name: str) -> Word | None:
    if field_name.startswith(PASSTHROUGH + "."):
        field_name = field_name[len(PASSTHROUGH) + 1:]
    best: tuple[int, Word] | None = None
    for table in (state.given, state.passthrough):
        for stored, given in table.items():
            key = stored.lstrip("+")
            bare_field = field_name.lstrip("+")
            if key == bare_field or bare_field.startswith(key + ".") or key.startswith(bare_field + "."):
                score = len(key) if bare_field.startswith(key) else len(bare_field)
                if best is None or score > best[0]:
                    best = (score, given.word)
    return best[1] if best else None


def _check_size(text: str) -> None:
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_INPUT_BYTES:
        raise VerlImportError(f"input is {size} bytes; the limit is {MAX_INPUT_BYTES} bytes",
                              text[MAX_INPUT_BYTES - 20 : MAX_INPUT_BYTES], MAX_INPUT_BYTES)


def import_command(text: str) -> ImportResult:
    """A verl launch script, command line or bare list of ``key=value`` overrides -> a spec and its warnings.

    The text is read as bash reads it (``worker.interop.shell``); the ``python3 -m verl.trainer.main_ppo``
    command's arguments are the overrides, every other command is ignored."""
    _check_size(text)
    state = _State()
    try:
        script = read_script(text)
    except ShellError as exc:
        raise VerlImportError(exc.message, exc.token, exc.position) from None
    words = _shell_overrides(_verl_words(script, state), state)
    for override in _parse_override_words(words, state.warnings):
        _apply(state, override, command_line=True)
    return _finish(state, text)


# --------------------------------------------------------------------------------------------
# YAML in


class _BoundedLoader(yaml.SafeLoader):
    """safe_load with limits: nesting depth while composing, and the number of values after
    aliases are expanded (an alias bomb composes to a few nodes and expands to billions)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            mark = self.peek_event().start_mark
            raise yaml.YAMLError(f"YAML nests deeper than {MAX_YAML_DEPTH} levels at character {mark.index}")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _expanded_size(node: yaml.Node, memo: dict[int, int], active: set[int]) -> int:
    ident = id(node)
    if ident in memo:
        return memo[ident]
    if ident in active:
        raise yaml.YAMLError("YAML aliases form a cycle")
    active.add(ident)
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, memo, active) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, memo, active) + _expanded_size(v, memo, active) for k, v in node.value)
    active.discard(ident)
    memo[ident] = size
    if size > MAX_YAML_NODES:
        raise yaml.YAMLError(f"YAML expands to more than {MAX_YAML_NODES} values (an alias bomb?)")
    return size


def _yaml_overrides(node: yaml.Node, loader: _BoundedLoader, text: str, prefix: str = "") -> list[Override]:
    """Leaves of a composed mapping as ``set`` overrides carrying each key's position."""
    out: list[Override] = []
    for key_node, value_node in node.value:
        start = key_node.start_mark.index
        word_text = text[start : value_node.end_mark.index] if value_node.end_mark else key_node.value
        word = Word(word_text, word_text, start)
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
            raise VerlImportError(f"YAML keys must be strings, got {key_node.value!r}", word_text, start)
        key = f"{prefix}{key_node.value}"
        if isinstance(value_node, yaml.MappingNode) and value_node.value:
            out.extend(_yaml_overrides(value_node, loader, text, key + "."))
            continue
        try:
            value = _decode_tree(loader.construct_object(value_node, deep=True))
        except ValueError as exc:
            raise VerlImportError(f"{key}: {exc}", word_text, start) from None
        raw = value_node.value if isinstance(value_node, yaml.ScalarNode) else None
        out.append(Override("set", key, value, raw, word))
    return out


_VERL_SEARCHPATH = {"searchpath": ["pkg://verl.trainer.config"]}


def _is_verl_searchpath(value: Any) -> bool:
    """The ``hydra:`` block ``export_yaml`` writes so that ``defaults: [ppo_trainer]`` is found."""
    return value == _VERL_SEARCHPATH


def _decode_tree(value: Any) -> Any:
    """``decode_omegaconf`` on every string of a YAML value, at any depth."""
    if isinstance(value, str):
        return decode_omegaconf(value)
    if isinstance(value, list):
        return [_decode_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: _decode_tree(v) for k, v in value.items()}
    return value


def import_yaml(text: str) -> ImportResult:
    """A verl YAML config (nested keys, as in the seed's example) -> a spec and its warnings."""
    _check_size(text)
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        if root is not None:
            _expanded_size(root, {}, set())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        index = mark.index if mark else 0
        raise VerlImportError(f"invalid YAML: {exc.problem or exc.context}", text[index : _word_end(text, index)],
                              index) from None
    except yaml.YAMLError as exc:
        raise VerlImportError(str(exc), text[:40], 0) from None
    except RecursionError:
        raise VerlImportError("YAML nests too deeply", text[:40], 0) from None
    finally:
        loader.dispose()
    state = _State()
    if root is None:
        return _finish(state, text)
    if not isinstance(root, yaml.MappingNode):
        raise VerlImportError("a verl YAML config must be a mapping of sections (actor_rollout_ref:, critic:, ...)",
                              text[:40], root.start_mark.index)
    body = []
    for key_node, value_node in root.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == "hydra" and isinstance(
                value_node, yaml.MappingNode):
            value_node.value = [(k, v) for k, v in value_node.value
                                if not (isinstance(k, yaml.ScalarNode) and k.value == "searchpath" and _is_verl_searchpath(
                                    {"searchpath": loader.construct_object(v, deep=True)}))]
            if not value_node.value:
                continue
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == "defaults":
            names = loader.construct_object(value_node, deep=True)
            if not (isinstance(names, list) and "ppo_trainer" in names):
                state.warn("ignored: the defaults list; keys are read against verl's ppo_trainer defaults")
            for entry in names if isinstance(names, list) else []:
                group = {k.removeprefix("override ").strip(): v for k, v in entry.items()} if isinstance(entry, dict) else {}
                if MODEL_ENGINE_KEY in group:
                    _apply(state, Override("set", MODEL_ENGINE_KEY, group[MODEL_ENGINE_KEY], None,
                                           Word(key_node.value, key_node.value, key_node.start_mark.index)),
                           command_line=False)
            continue
        body.append((key_node, value_node))
    root.value = body
    for override in _yaml_overrides(root, loader, text):
        _apply(state, override, command_line=False)
    return _finish(state, text)


# --------------------------------------------------------------------------------------------
# Export


_SAFE_UNQUOTED = re.compile(r"^[A-Za-z0-9_\-/+.%*@?|]+$")


def _hydra_quote(s: str) -> str:
    """A Hydra quoted string that reads back as ``s``: backslash runs before the quote or the end
    are doubled, the quote is escaped."""
    quote = '"' if '"' not in s or "'" in s else "'"
    body = re.sub(r"(\\*)(" + re.escape(quote) + r"|$)",
                  lambda m: "\\" * (2 * len(m.group(1))) + ("\\" + quote if m.group(2) else ""), s)
    return quote + body + quote


def hydra_value(value: Any) -> str:
    """A Python value as Hydra override text that ``parse_hydra_value`` (and Hydra) read back equal."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))
    if isinstance(value, str):
        encoded = encode_omegaconf(value)
        if _SAFE_UNQUOTED.match(encoded) and encoded == value and _typed_primitive(value) == value:
            return value
        return _hydra_quote(encoded)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_dict_key(k)}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as a Hydra value")


def _dict_key(key: Any) -> str:
    if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise TypeError(f"Hydra dict keys must be identifiers, got {key!r}")
    return key


def _export_items(spec: RunSpec, *, full: bool) -> list[tuple[str, Any]]:
    """The (dotted key, value) pairs to write, override_config expanded one leaf per key."""
    flat = _spec_flat(spec)
    items: list[tuple[str, Any]] = []
    for key in SPEC_KEYS:
        if key in OPEN_DICT_FIELDS:
            items.extend((k, v) for k, v in flat.items() if k.startswith(key + "."))
            continue
        value = flat[key]
        verl_key = VERL_NAMES.get(key, key)
        verl_default = VERL_DEFAULTS.get(verl_key, _SPEC_DEFAULTS[key])
        if full or verl_default == MANDATORY or not _same(value, verl_default) or not _same(value, _SPEC_DEFAULTS[key]):
            items.append((verl_key, value))
    # Every pass-through key, as given: a key verl's config lacks keeps its + (see split_passthrough).
    items.extend(spec.verl_passthrough.items())
    return items


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _export_warnings(spec: RunSpec, keys: list[str]) -> list[str]:
    warnings: list[str] = []
    if "attn_implementation" in spec.critic.model.override_config:
        warnings.append(CRITIC_ATTN_WARNING)
    if any(k.startswith("attnboard.") for k in keys):
        warnings.append(ATTNBOARD_KEYS_WARNING)
    name = spec.actor_rollout_ref.rollout.name
    warnings.append(HF_ROLLOUT_WARNING if name == "hf" else engine_rollout_warning(name))
    return warnings


def export_command(spec: RunSpec, *, entrypoint: str = DEFAULT_ENTRYPOINT, full: bool = False) -> ExportResult:
    """The spec as a verl command line, one override per line. Keys in verl's default config are
    written bare, the others (override_config sub-keys, attnboard.*, pass-through keys verl's config
    lacks) with ``+``. Without ``full``, only modelled keys that differ from verl's defaults, plus the
    mandatory ones; the pass-through keys are always written."""
    items = _export_items(spec, full=full)
    lines = [entrypoint]
    warnings: list[str] = []
    for key, value in items:
        try:
            text = value if key in KEPT_INTERPOLATIONS and value == KEPT_INTERPOLATIONS[key] else hydra_value(value)
        except TypeError as exc:
            warnings.append(f"skipped {key}: {exc}")
            continue
        bare = key.lstrip("+")
        if "\x00" in text:
            warnings.append(f"skipped {key}: a NUL character cannot be passed on a command line")
            continue
        if not _KEY.match(bare):
            warnings.append(f"skipped {key}: not a dotted key Hydra can read")
            continue
        plus = "+" if key.startswith("+") or needs_plus(bare, spec.model_engine) else ""
        lines.append("    " + shlex.quote(f"{plus}{bare}={text}"))
    warnings = _export_warnings(spec, [k for k, _ in items]) + warnings
    return ExportResult(text=" \\\n".join(lines) + "\n", warnings=warnings)


class _Unescaped(str):
    """A kept interpolation (``KEPT_INTERPOLATIONS``): written as is, for verl to resolve."""


def _tree_for_yaml(value: Any) -> Any:
    if isinstance(value, _Unescaped):
        return str(value)
    if isinstance(value, dict):
        return {k: _tree_for_yaml(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tree_for_yaml(v) for v in value]
    if isinstance(value, str):
        return encode_omegaconf(value)
    return value


def export_yaml(spec: RunSpec, *, full: bool = True) -> ExportResult:
    """The spec as a verl YAML config: ``defaults: [ppo_trainer, _self_]`` then the nested keys, so
    ``python3 -m verl.trainer.main_ppo --config-path=DIR --config-name=FILE`` runs it. No ``+`` is
    needed in a config file: composition may add keys that the defaults lack."""
    items = _export_items(spec, full=full)
    tree = unflatten({k.lstrip("+"): _Unescaped(v) if k in KEPT_INTERPOLATIONS and v == KEPT_INTERPOLATIONS[k] else v
                      for k, v in items})
    keys = [k for k, _ in items]
    engine = tree.pop(MODEL_ENGINE_KEY, ModelEngine.dp.value)
    document = {
        "hydra": {**_VERL_SEARCHPATH, **_tree_for_yaml(tree.pop("hydra", {}))},
        "defaults": ["ppo_trainer", *([{f"override {MODEL_ENGINE_KEY}": engine}] if engine != ModelEngine.dp.value else []),
                     "_self_"],
        **_tree_for_yaml(tree),
    }
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)
    if yaml.safe_load(text) != document:
        # PyYAML writes some characters (NEL, LS, PS) raw that read back as line breaks: escape them all.
        text = yaml.safe_dump(document, sort_keys=False, allow_unicode=False, default_flow_style=False, width=100)
    return ExportResult(text=text, warnings=_export_warnings(spec, keys))

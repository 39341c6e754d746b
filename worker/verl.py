"""verl interop: a verl command line or YAML in, a RunSpec out, and back again.

Pure logic, no I/O. Three layers, each undone exactly by its inverse on export:

1. the shell: words, quotes, backslash-newline continuations, leading ``NAME=value`` environment
   assignments and the ``python3 -m verl.trainer.main_ppo`` / ``python3 ppo_trainer.py`` entry point;
2. Hydra's override grammar: ``key=value``, ``+key=value`` (add), ``++key=value`` (add or replace),
   ``~key`` (delete), values typed as Hydra types them (null, bools, ints, floats, quoted strings,
   ``[lists]``, ``{dicts}``);
3. OmegaConf interpolations: ``${key}`` and ``${oc.select:key,default}``, resolved against the
   imported config; ``\\${`` is a literal ``${``.

Keys are checked against the spec (``worker.spec``) and against verl 0.9.1's generated default config
(``worker.verl_keys``): a key verl has but attnboard does not model is dropped with a warning, a key
neither knows is an error suggesting the nearest valid key. Hydra's struct mode decides the ``+``:
keys present in verl's default config are written bare, keys that are not (every ``override_config``
sub-key, every ``attnboard.*`` key) need ``+``.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from worker.spec import (
    ALIASES,
    DEFAULT_LOCAL_DIR,
    OPEN_DICT_FIELDS,
    SPEC_KEYS,
    RunSpec,
    SpecError,
    flatten,
    nearest_key,
    parse_spec,
    unflatten,
)
from worker.verl_keys import MANDATORY, VERL_DEFAULTS, VERL_VERSION

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
# Layer 1: the shell


@dataclass(frozen=True)
class Word:
    """One shell word: its text after quote removal, the original characters and where they start."""

    text: str
    raw: str
    position: int


_SHELL_OPERATORS = "|&<>()`"
SEPARATOR = "\n"
"""The word ``shell_words`` emits where a command ends (an unescaped newline or ``;``)."""
_SHELL_VAR = re.compile(r"\$(\{[^}]*\}?|[A-Za-z_][A-Za-z0-9_]*|\(|[0-9@*#?$!-])")


def shell_words(text: str) -> list[Word]:
    """Split a shell command line the way bash would, without expanding anything.

    Backslash-newline joins lines; an unescaped newline or ``;`` ends a command and comes out as the
    word ``SEPARATOR``. ``# comments`` are dropped. Shell variables, command substitution and other
    operators are refused: their values are not known here (``$@`` and ``$*`` are kept as words).
    """
    words: list[Word] = []
    buf: list[str] = []
    start: int | None = None
    i, n = 0, len(text)

    def fail(message: str, at: int, end: int | None = None) -> VerlImportError:
        stop = end if end is not None else _word_end(text, at)
        return VerlImportError(message, text[at:stop], at)

    def check_variable(at: int) -> None:
        match = _SHELL_VAR.match(text, at)
        if match and match.group(1) not in ("@", "*"):
            raise fail(f"shell expansion {match.group(0)} is not expanded by the import: replace it with its value",
                       at, match.end())

    while i < n:
        ch = text[i]
        if ch == "\\" and text.startswith("\n", i + 1):
            i += 2
            continue
        if ch == "\\" and text.startswith("\r\n", i + 1):
            i += 3
            continue
        if ch in " \t\r\n;":
            if start is not None:
                words.append(Word("".join(buf), text[start:i], start))
                buf, start = [], None
            if ch in "\n;":
                words.append(Word(SEPARATOR, ch, i))
            i += 1
            continue
        if ch == "#" and start is None:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if start is None:
            start = i
        if ch == "\\":
            if i + 1 < n:
                buf.append(text[i + 1])
            i += 2
        elif ch == "'":
            close = text.find("'", i + 1)
            if close < 0:
                raise fail("unbalanced single quote: no closing '", i, n)
            buf.append(text[i + 1 : close])
            i = close + 1
        elif ch == '"':
            j = i + 1
            while True:
                if j >= n:
                    raise fail('unbalanced double quote: no closing "', i, n)
                c = text[j]
                if c == '"':
                    break
                if c == "\\" and j + 1 < n and text[j + 1] in '"\\$`\n':
                    if text[j + 1] != "\n":
                        buf.append(text[j + 1])
                    j += 2
                    continue
                if c == "$":
                    check_variable(j)
                if c == "`":
                    raise fail("command substitution with ` is not supported", j)
                buf.append(c)
                j += 1
            i = j + 1
        elif ch == "$":
            check_variable(i)
            buf.append(ch)
            i += 1
        elif ch in _SHELL_OPERATORS:
            raise fail(f"shell operator {ch!r} is not supported: paste a single command", i, i + 1)
        else:
            buf.append(ch)
            i += 1
    if start is not None:
        words.append(Word("".join(buf), text[start:], start))
    return words


_NON_SPACE = re.compile(r"\S*")


def _word_end(text: str, at: int) -> int:
    match = _NON_SPACE.match(text, at)
    return match.end() if match else at + 1


_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_INTERPRETER = re.compile(r"^(?:.*/)?python(?:\d+(?:\.\d+)?)?$")


def _looks_like_overrides(command: list[Word]) -> bool:
    return all("=" in w.text or w.text.startswith(("~", "[", "$")) or w.text.endswith("]") or w.text == "..."
               for w in command)


def _split_command(all_words: list[Word], warnings: list[str]) -> list[Word]:
    """Pick the python command out of a pasted script and drop its environment assignments,
    interpreter and entry point; return the override words.

    Other commands before it (``set -x``, ``export ...``) are ignored with a warning; lines after it
    that hold only overrides are read as its continuation (a lost trailing backslash); without a
    python command every line is read as overrides.
    """
    commands: list[list[Word]] = [[]]
    for word in all_words:
        if word.text == SEPARATOR and word.raw in ("\n", ";"):
            commands.append([])
        else:
            commands[-1].append(word)
    commands = [c for c in commands if c]
    main = next((k for k, c in enumerate(commands) if any(_INTERPRETER.match(w.text) for w in c)), None)
    if main is None:
        return [w for c in commands for w in c]  # a bare list of overrides
    words = list(commands[main])
    for k, command in enumerate(commands):
        if k < main or (k > main and not _looks_like_overrides(command)):
            warnings.append(f"ignored: shell command {' '.join(w.raw for w in command)[:80]}")
        elif k > main:
            words.extend(command)
    interpreter = next(k for k, w in enumerate(words) if _INTERPRETER.match(w.text))
    for word in words[:interpreter]:
        if word.text == "env":
            continue
        if not _ENV_ASSIGNMENT.match(word.text):
            raise VerlImportError(
                f"expected environment assignments (NAME=value) before {words[interpreter].text}, got {word.text!r}",
                word.raw, word.position)
        warnings.append(f"ignored: environment variable {word.text.split('=', 1)[0]}")
    k = interpreter + 1
    entry: Word | None = None
    while k < len(words):
        word = words[k]
        if word.text == "-m" and k + 1 < len(words):
            entry = words[k + 1]
            k += 2
            break
        if word.text in ("-X", "-W") and k + 1 < len(words):
            k += 2
            continue
        if re.fullmatch(r"-[BOuIsSEq]+", word.text):
            k += 1
            continue
        entry = word
        k += 1
        break
    if entry is None:
        raise VerlImportError(f"expected -m {VERL_MODULE} or a script after the interpreter",
                              words[interpreter].raw, words[interpreter].position)
    name = entry.text
    if name != VERL_MODULE and name.rsplit("/", 1)[-1] not in VERL_SCRIPTS:
        warnings.append(f"entry point {name} is not {VERL_MODULE}: its keys are read as main_ppo's")
    return words[k:]


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


def _parse_override_words(words: list[Word], warnings: list[str]) -> list[Override]:
    overrides: list[Override] = []
    k = 0
    while k < len(words):
        word = words[k]
        text = word.text
        k += 1
        if text in _PLACEHOLDER_WORDS or (text.startswith(("[", "<")) and "=" not in text):
            parts = [word.raw]
            closer = "]" if text.startswith("[") else ">"
            while not parts[-1].endswith(closer) and k < len(words) and "=" not in words[k].text:
                parts.append(words[k].raw)
                k += 1
            warnings.append(f"skipped placeholder {' '.join(parts)}")
            continue
        if text in ("$@", "$*"):
            warnings.append(f"ignored: {text} (the arguments of the script it came from)")
            continue
        if text.startswith("-"):
            name = text.split("=", 1)[0]
            if name in ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd"):
                if "=" not in text and k < len(words):
                    k += 1
                warnings.append(f"ignored: Hydra option {name}; keys are read against verl's ppo_trainer defaults")
                continue
            if name in ("--multirun", "-m"):
                warnings.append(f"ignored: Hydra option {name}")
                continue
            raise VerlImportError(f"unknown option {name}: expected key=value overrides", word.raw, word.position)
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
            raise VerlImportError(f"expected key=value, got {text!r}: '=' is missing", word.raw, word.position)
        if "@" in key:
            raise VerlImportError(f"Hydra package overrides ({key}) are not supported", word.raw, word.position)
        if not _KEY.match(key):
            raise VerlImportError(f"invalid key {key!r}: expected dotted names such as data.train_batch_size",
                                  word.raw, word.position)
        value: Any = None
        if eq:
            try:
                value = parse_hydra_value(raw_value)
            except ValueError as exc:
                raise VerlImportError(f"{key}: {exc}", word.raw, word.position) from None
        overrides.append(Override(op, key, value, raw_value if eq else None, word))
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


_ANNOTATIONS = _field_annotations(RunSpec)
_STRING_KEYS = frozenset(k for k, ann in _ANNOTATIONS.items() if ann is str or ann == (str | None))
_MODELLED = frozenset(SPEC_KEYS) - frozenset(OPEN_DICT_FIELDS)
_SECTIONS = frozenset(k.rsplit(".", i)[0] for k in SPEC_KEYS for i in range(1, k.count(".") + 1))
_VERL_SECTIONS = frozenset(k.rsplit(".", i)[0] for k in VERL_DEFAULTS for i in range(1, k.count(".") + 1))


def _spec_tree(spec: RunSpec) -> dict[str, Any]:
    # Python mode, not JSON: JSON mode turns an override_config float inf into null.
    return spec.model_dump()


def _spec_flat(spec: RunSpec) -> dict[str, Any]:
    return flatten(_spec_tree(spec))


_SPEC_DEFAULTS = _spec_flat(RunSpec())

VERL_NAMES: dict[str, str] = {
    spec_key: verl_key
    for spec_key, verl_key in (
        ("actor_rollout_ref.actor.fsdp_config.turbo_cp_size",
         "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.ulysses_parallel_size"),
        ("critic.turbo_cp_size", "critic.fsdp.turbo_config.distributed.ulysses_parallel_size"),
    )
    if spec_key in SPEC_KEYS and verl_key in VERL_DEFAULTS
}
"""Spec keys that verl spells differently: FSDP-Turbo's CP group size is verl's
``turbo_config.distributed.ulysses_parallel_size``. Read on import, written on export."""
_SPEC_NAMES = {verl_key: spec_key for spec_key, verl_key in VERL_NAMES.items()}

KEPT_INTERPOLATIONS: dict[str, str] = {"trainer.default_local_dir": DEFAULT_LOCAL_DIR}
"""verl defaults that are interpolations and that the spec keeps as text, resolved when the engine uses
them (``worker.checkpoint.checkpoint_folder``): the import leaves the exact default unresolved, the export
writes it unescaped, so verl reads it as its own default and a spec at verl's defaults round-trips."""

Kind = Literal["spec", "open", "section", "verl", "hydra", "unknown"]


def _open_field(key: str) -> str | None:
    return next((f for f in OPEN_DICT_FIELDS if key == f or key.startswith(f + ".")), None)


def _classify(key: str) -> Kind:
    if key in _MODELLED:
        return "spec"
    if _open_field(key):
        return "open"
    if key in _SECTIONS:
        return "section"
    if key == "hydra" or key.startswith("hydra."):
        return "hydra"
    if key in VERL_DEFAULTS or key in _VERL_SECTIONS:
        return "verl"
    # Under a verl leaf whose default is an open dict or null (engine_kwargs.vllm: {}, ...).
    parts = key.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        ancestor = ".".join(parts[:cut])
        if ancestor in VERL_DEFAULTS:
            return "verl" if VERL_DEFAULTS[ancestor] in ({}, None) else "unknown"
    return "unknown"


def _unknown_key_message(key: str) -> str:
    near = nearest_key(key)
    hint = f"; did you mean {near}?" if near else ""
    return f"unknown key {key}: neither attnboard nor verl {VERL_VERSION} has it{hint}"


@dataclass
class _Given:
    value: Any
    raw: str | None
    word: Word


@dataclass
class _State:
    given: dict[str, _Given] = field(default_factory=dict)
    """Modelled keys (override_config sub-keys dotted in full), in the order given."""
    verl_only: dict[str, _Given] = field(default_factory=dict)
    """Keys verl has and attnboard ignores; kept for interpolations."""
    warnings: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)


def _assign(table: dict[str, _Given], key: str, given: _Given) -> None:
    for other in list(table):
        if other.startswith(key + "."):
            del table[other]
        elif key.startswith(other + ".") and not isinstance(table[other].value, dict):
            del table[other]
    table[key] = given


def _delete(table: dict[str, _Given], key: str) -> None:
    for other in list(table):
        if other == key or other.startswith(key + "."):
            del table[other]


def _apply(state: _State, override: Override, *, command_line: bool) -> None:
    key = override.key
    if key in ALIASES:
        state.warn(f"{key} is deprecated in verl; read as {ALIASES[key]}")
        key = ALIASES[key]
    key = _SPEC_NAMES.get(key, key)
    kind = _classify(key)
    if kind == "section":
        if override.op == "delete":
            for sub in [k for k in state.given if k.startswith(key + ".")]:
                del state.given[sub]
            state.warn(f"~{override.key}: reset to attnboard's defaults")
            return
        if not isinstance(override.value, dict):
            raise VerlImportError(f"{key} is a section, not a value: give one of its keys, e.g. "
                                  f"{next(k for k in SPEC_KEYS if k.startswith(key + '.'))}",
                                  override.word.raw, override.word.position)
        for sub, value in override.value.items():
            _apply(state, Override(override.op, f"{key}.{sub}", value, None, override.word), command_line=command_line)
        return
    if kind == "unknown":
        raise VerlImportError(_unknown_key_message(key), override.word.raw, override.word.position)
    if kind == "hydra":
        state.warn(f"ignored: {key} configures Hydra itself")
        return
    if kind == "verl":
        state.warn(f"ignored: attnboard does not model {key}")
        if override.op == "delete":
            _delete(state.verl_only, key)
        else:
            _assign(state.verl_only, key, _Given(override.value, override.raw_value, override.word))
        return
    if command_line:
        in_verl = override.key in VERL_DEFAULTS
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
    _assign(state.given, key, _Given(override.value, override.raw_value, override.word))


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
    for table in (state.given, state.verl_only):
        if target in table:
            return _kept(target, table[target].value)
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


def _finish(state: _State, source_text: str) -> ImportResult:
    flat: dict[str, Any] = {}
    for key, given in state.given.items():
        if isinstance(given.value, Interpolation) and given.value.text() == KEPT_INTERPOLATIONS.get(key):
            flat[key] = KEPT_INTERPOLATIONS[key]
            continue
        try:
            value = _resolve(state, key, given.value)
        except (KeyError, ValueError) as exc:
            message = exc.args[0] if exc.args else str(exc)
            raise VerlImportError(f"{key}: {message}", given.word.raw, given.word.position) from None
        if key in _STRING_KEYS and isinstance(value, (bool, int, float)):
            value = given.raw.strip() if given.raw is not None else str(value)
        flat[key] = value
    try:
        spec = parse_spec(flat)
    except SpecError as exc:
        errors = [i for i in exc.issues if i.severity == "error"] or exc.issues
        first = errors[0]
        word = _word_for(state, first.field) or Word(source_text[:80], source_text[:80], 0)
        message = "; ".join(f"{i.field}: {i.message}" for i in errors)
        raise VerlImportError(message, word.raw, word.position, issues=errors) from None
    if "attn_implementation" in spec.critic.model.override_config:
        state.warn(CRITIC_ATTN_WARNING)
    if "actor_rollout_ref.rollout.name" in flat:
        name = spec.actor_rollout_ref.rollout.name
        state.warn(HF_ROLLOUT_WARNING if name == "hf" else engine_rollout_warning(name))
    return ImportResult(spec=spec, warnings=state.warnings, overrides=flat)


def _word_for(state: _State, field_name: str) -> Word | None:
    best: tuple[int, Word] | None = None
    for key, given in state.given.items():
        if key == field_name or field_name.startswith(key + ".") or key.startswith(field_name + "."):
            score = len(key) if field_name.startswith(key) else len(field_name)
            if best is None or score > best[0]:
                best = (score, given.word)
    return best[1] if best else None


def _check_size(text: str) -> None:
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_INPUT_BYTES:
        raise VerlImportError(f"input is {size} bytes; the limit is {MAX_INPUT_BYTES} bytes",
                              text[MAX_INPUT_BYTES - 20 : MAX_INPUT_BYTES], MAX_INPUT_BYTES)


def import_command(text: str) -> ImportResult:
    """A verl command line (or a bare list of ``key=value`` overrides) -> a spec and its warnings."""
    _check_size(text)
    state = _State()
    words = _split_command(shell_words(text), state.warnings)
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

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: ANN401 - PyYAML's signature
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
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == "hydra" and _is_verl_searchpath(
                loader.construct_object(value_node, deep=True)):
            continue
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == "defaults":
            names = loader.construct_object(value_node, deep=True)
            if not (isinstance(names, list) and "ppo_trainer" in names):
                state.warn("ignored: the defaults list; keys are read against verl's ppo_trainer defaults")
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
    return items


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def _export_warnings(spec: RunSpec, keys: list[str]) -> list[str]:
    warnings: list[str] = []
    if "attn_implementation" in spec.critic.model.override_config:
        warnings.append(CRITIC_ATTN_WARNING)
    if any(k not in VERL_DEFAULTS and not _open_field(k) for k in keys):
        warnings.append(ATTNBOARD_KEYS_WARNING)
    name = spec.actor_rollout_ref.rollout.name
    warnings.append(HF_ROLLOUT_WARNING if name == "hf" else engine_rollout_warning(name))
    return warnings


def export_command(spec: RunSpec, *, entrypoint: str = DEFAULT_ENTRYPOINT, full: bool = False) -> ExportResult:
    """The spec as a verl command line, one override per line. Keys in verl's default config are
    written bare, the others (override_config sub-keys, attnboard.*) with ``+``. Without ``full``,
    only keys that differ from verl's defaults, plus the mandatory ones."""
    items = _export_items(spec, full=full)
    lines = [entrypoint]
    warnings: list[str] = []
    for key, value in items:
        try:
            text = value if key in KEPT_INTERPOLATIONS and value == KEPT_INTERPOLATIONS[key] else hydra_value(value)
        except TypeError as exc:
            warnings.append(f"skipped {key}: {exc}")
            continue
        if not _KEY.match(key):
            warnings.append(f"skipped {key}: not a dotted key Hydra can read")
            continue
        plus = "" if key in VERL_DEFAULTS else "+"
        lines.append("    " + shlex.quote(f"{plus}{key}={text}"))
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
    tree = unflatten({k: _Unescaped(v) if k in KEPT_INTERPOLATIONS and v == KEPT_INTERPOLATIONS[k] else v
                     for k, v in items})
    keys = [k for k, _ in items]
    document = {
        "hydra": _VERL_SEARCHPATH,
        "defaults": ["ppo_trainer", "_self_"],
        **_tree_for_yaml(tree),
    }
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)
    if yaml.safe_load(text) != document:
        # PyYAML writes some characters (NEL, LS, PS) raw that read back as line breaks: escape them all.
        text = yaml.safe_dump(document, sort_keys=False, allow_unicode=False, default_flow_style=False, width=100)
    return ExportResult(text=text, warnings=_export_warnings(spec, keys))

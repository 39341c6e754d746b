"""Hydra's override grammar (``key=value``, ``+``, ``++``, ``~``, values typed as Hydra types them) and
OmegaConf's interpolations, both ways: read (``parse_hydra_value``) and written (``hydra_value``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from worker.interop.shell import Word
from worker.interop.verl.results import PPO_CONFIG_NAMES, RETIRED_CONFIG_WARNING, VerlImportError
from worker.spec.engines import MODEL_ENGINE_KEY, RETIRED_CONFIGS
from worker.spec.passthrough import HYDRA_WRITABLE_KEY
from worker.spec.verl_defaults import VERL_VERSION

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


STRATEGY_KEYS = ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy",
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
    """A dict key as Hydra reads it back: a name, or a path pattern with ``()[]{}:=,`` escaped."""
    if not isinstance(key, str) or not HYDRA_WRITABLE_KEY.match(key):
        raise TypeError(f"Hydra dict keys must match {HYDRA_WRITABLE_KEY.pattern}, got {key!r}")
    return re.sub(r"([()\[\]{}:=,])", r"\\\1", key)


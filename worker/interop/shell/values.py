"""Values: a scalar is a tuple of pieces; what kind each is decides brace expansion and field splitting."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["lit", "quoted", "split", "verbatim"]
"""``lit``: unquoted source text (brace expansion applies); ``quoted``: quoted or escaped text;
``split``: the value of an unquoted expansion (field splitting applies); ``verbatim``: not known here."""



@dataclass(frozen=True)
class Piece:
    text: str
    kind: Kind


Value = tuple[Piece, ...]
"""A string being built, or a variable's value (kinds ``quoted`` and ``verbatim`` only)."""


@dataclass(frozen=True)
class _Unknown:
    """A variable whose value is not known here (set in a branch that may not run, by read, ...)."""

    reason: str


@dataclass(frozen=True)
class _Positional:
    """``"$@"`` of a script whose arguments are not known."""


_Var = Value | list[Value] | _Unknown
"""A variable: a scalar, an indexed array, or unknown."""

_FIELD_BREAK = Piece("", "quoted")  # separates the fields of "${ARR[@]}" inside one expansion


def _text(value: Value) -> str:
    return "".join(p.text for p in value)


def _known(value: Value) -> bool:
    return not any(p.kind == "verbatim" for p in value)


def _stored(value: Value) -> Value:
    """A value as a variable keeps it: its text no longer splits or brace-expands by itself."""
    out: list[Piece] = []
    for piece in value:
        kind: Kind = "verbatim" if piece.kind == "verbatim" else "quoted"
        if out and out[-1].kind == kind:
            out[-1] = Piece(out[-1].text + piece.text, kind)
        elif piece.text or kind == "verbatim":
            out.append(Piece(piece.text, kind))
    return tuple(out)



class _NotKnown(Exception):
    """An arithmetic or test operand whose value is not known here."""



def _scalar(value: _Var | None, index: str | None) -> Value | None:
    if value is None or isinstance(value, (_Unknown, _Positional)):
        return None
    if isinstance(value, list):
        if index is not None and index.isdigit():
            i = int(index)
            return value[i] if i < len(value) else None
        return value[0] if value else None
    return value


def _requote(value: Value, quoted: bool) -> list[Piece]:
    """A stored value as it comes out of an expansion: its text splits unless the expansion is quoted."""
    if quoted:
        return [Piece(p.text, "verbatim" if p.kind == "verbatim" else "quoted") for p in value] or [Piece("", "quoted")]
    return [Piece(p.text, "verbatim" if p.kind == "verbatim" else "split") for p in value] or [Piece("", "split")]


def _requote_text(value, text: str, quoted: bool, reader: object) -> list[Piece]:
    if isinstance(value, tuple):
        return _requote(value, quoted)
    return [Piece(text, "verbatim")]



_DOUBLE_ESCAPES = re.compile(r"\\([$`\"\\\n])")


def _unescape_double(text: str) -> str:
    """Inside double quotes a backslash escapes only $ ` " \\ and newline (which it removes)."""
    return _DOUBLE_ESCAPES.sub(lambda m: "" if m.group(1) == "\n" else m.group(1), text)


def _unescape_unquoted(text: str) -> list[Piece]:
    """Unquoted text: a backslash quotes the next character (a backslash-newline disappears)."""
    if "\\" not in text:
        return [Piece(text, "lit")] if text else []
    out: list[Piece] = []
    buf: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            if buf:
                out.append(Piece("".join(buf), "lit"))
                buf = []
            if text[i + 1] != "\n":
                out.append(Piece(text[i + 1], "quoted"))
            i += 2
            continue
        buf.append(ch)
        i += 1
    if buf:
        out.append(Piece("".join(buf), "lit"))
    return out


_ANSI = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "v": "\v",
         "\\": "\\", "'": "'", '"': '"', "?": "?"}


def _ansi_c(body: str) -> str:
    def sub(m: re.Match) -> str:
        esc = m.group(1)
        if esc[0] in _ANSI and len(esc) == 1:
            return _ANSI[esc[0]]
        if esc[0] == "x":
            return chr(int(esc[1:], 16)) if len(esc) > 1 else "\\x"
        if esc[0] in "uU":
            code = int(esc[1:], 16) if len(esc) > 1 else None
            return chr(code) if code is not None and code <= 0x10FFFF else "\\" + esc
        if esc[0] in "01234567":
            return chr(int(esc, 8) & 0xFF)
        return "\\" + esc

    return re.sub(r"\\(x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|[0-7]{1,3}|.)", sub, body, flags=re.S)

"""Pattern matching on linear-time matchers, never a backtracking engine on script text.

bash's globs (``case``, ``[[ $X == pat ]]``, ``${X#pat}``, ``${X%%pat}``, ``${X//pat/rep}``) run on a
Thompson NFA of our own: a glob is a sequence of one-character atoms and ``*``, so the set of live
states after each character is at most the pattern's length, and one pass over the text finds every
prefix that matches (``#``, ``##``), every suffix (``%``, ``%%``, the pattern reversed on the text
reversed) and every place a match can start (``/``, ``//``). ``[[ $X =~ RE ]]`` runs on RE2
(google-re2, an automaton, linear in the text) with POSIX ERE syntax as bash hands it to regcomp:
bracket expressions with ``[:classes:]``, intervals, and glibc's ``\\w \\s \\b`` extensions; what RE2
cannot run (back-references, ``\\<``) is a test the import cannot decide, as for an unknown value.

Python's ``re`` backtracks: ``^(a+)+$`` on 28 a's and a ``!`` takes 9 s there, each two characters
more four times as long, while it holds the GIL. Here each match charges the reader
(characters x live states) steps, so the step budget bounds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from worker.interop.shell.values import Piece, _NotKnown

Charge = Callable[[int], None]
"""Counts work (steps) against the reader's budget; raises when it is spent."""



# --------------------------------------------------------------------------------------------
# Globs


@dataclass(frozen=True)
class _Set:
    """A bracket expression: single characters, ranges and ``[:class:]`` names, maybe negated."""

    negate: bool
    chars: frozenset[str]
    ranges: tuple[tuple[str, str], ...]
    classes: tuple[str, ...]

    def matches(self, ch: str) -> bool:
        hit = ch in self.chars or any(lo <= ch <= hi for lo, hi in self.ranges) or any(
            _CLASSES[name](ch) for name in self.classes)
        return hit != self.negate


_CLASSES: dict[str, Callable[[str], bool]] = {
    "alpha": str.isalpha, "digit": lambda c: c in "0123456789", "alnum": str.isalnum, "upper": str.isupper,
    "lower": str.islower, "space": str.isspace, "blank": lambda c: c in " \t", "punct": lambda c: c.isascii() and (
        c.isprintable() and not c.isalnum() and not c.isspace()), "print": lambda c: c.isprintable(),
    "graph": lambda c: c.isprintable() and not c.isspace(), "cntrl": lambda c: not c.isprintable(),
    "xdigit": lambda c: c in "0123456789abcdefABCDEF", "word": lambda c: c.isalnum() or c == "_",
}

Atom = str | _Set | None
"""One character (``str``), a bracket expression (``_Set``), any character (``None``); ``STAR`` is ``*``."""
STAR = "*star*"


def _bracket(text: str, i: int) -> tuple[_Set, int] | None:
    """The bracket expression opening at ``text[i] == '['`` and the index after it, or None (a literal ``[``)."""
    j = i + 1
    negate = j < len(text) and text[j] in "!^"
    j += negate
    chars: set[str] = set()
    ranges: list[tuple[str, str]] = []
    classes: list[str] = []
    first = True
    while j < len(text):
        ch = text[j]
        if ch == "]" and not first:
            return _Set(negate, frozenset(chars), tuple(ranges), tuple(classes)), j + 1
        first = False
        if ch == "[" and text.startswith(("[:", "[=", "[."), j):
            close = text.find(text[j + 1] + "]", j + 2)
            if close < 0:
                return None
            name = text[j + 2:close]
            if text[j + 1] == ":":
                if name not in _CLASSES:
                    return None
                classes.append(name)
            else:
                chars.update(name)
            j = close + 2
            continue
        if ch == "\\" and j + 1 < len(text):
            j += 1
            ch = text[j]
        if j + 2 < len(text) and text[j + 1] == "-" and text[j + 2] != "]":
            hi = text[j + 2]
            if hi == "\\" and j + 3 < len(text):
                hi = text[j + 3]
                j += 1
            ranges.append((ch, hi))
            j += 3
            continue
        chars.add(ch)
        j += 1
    return None


def compile_glob(pieces: Sequence[Piece]) -> tuple[Atom, ...]:
    """A bash pattern (quoted and unknown parts literal, the rest glob syntax) as NFA atoms."""
    atoms: list[Atom] = []
    for piece in pieces:
        text = piece.text
        if piece.kind in ("quoted", "verbatim"):
            atoms.extend(text)
            continue
        i = 0
        while i < len(text):
            ch = text[i]
            if ch == "*":
                if not atoms or atoms[-1] != STAR:
                    atoms.append(STAR)
                i += 1
            elif ch == "?":
                atoms.append(None)
                i += 1
            elif ch == "[" and (found := _bracket(text, i)) is not None:
                atoms.append(found[0])
                i = found[1]
            elif ch == "\\" and i + 1 < len(text):
                atoms.append(text[i + 1])
                i += 2
            else:
                atoms.append(ch)
                i += 1
    return tuple(atoms)


class _Glob:
    """The NFA of a glob: state ``k`` waits for atom ``k``; state ``len(atoms)`` accepts."""

    def __init__(self, atoms: tuple[Atom, ...]):
        self.atoms = atoms
        self.accept = len(atoms)
        # closure[k]: the states reached from k without reading (a * may match nothing)
        self.closure: list[frozenset[int]] = [frozenset()] * (len(atoms) + 1)
        self.closure[self.accept] = frozenset({self.accept})
        for k in range(len(atoms) - 1, -1, -1):
            self.closure[k] = frozenset({k}) | (self.closure[k + 1] if atoms[k] == STAR else frozenset())

    def step(self, states: frozenset[int], ch: str) -> frozenset[int]:
        out: set[int] = set()
        for k in states:
            if k == self.accept:
                continue
            atom = self.atoms[k]
            if atom == STAR:
                out |= self.closure[k]
            elif atom is None or (atom == ch if isinstance(atom, str) else atom.matches(ch)):
                out |= self.closure[k + 1]
        return frozenset(out)

    def ends(self, s: str, start: int, charge: Charge, *, first_only: bool = False) -> list[int]:
        """Every ``k >= start`` with ``s[start:k]`` matching, in increasing order (one pass)."""
        states = self.closure[0]
        found = [start] if self.accept in states else []
        for k in range(start, len(s)):
            if first_only and found:
                break
            states = self.step(states, s[k])
            charge(len(states) + 1)
            if not states:
                break
            if self.accept in states:
                found.append(k + 1)
        return found

    def starts(self, s: str, charge: Charge) -> list[bool]:
        """For each ``i``, whether a non-empty match starts there: this NFA must be the pattern reversed; it
        runs once over ``s`` reversed, a new match trying to begin at every character."""
        n = len(s)
        can = [False] * (n + 1)
        states: frozenset[int] = frozenset()
        for q in range(1, n + 1):
            states = self.step(states | self.closure[0], s[n - q])
            charge(len(states) + 1)
            if self.accept in states:
                can[n - q] = True
        return can


def _reversed(atoms: tuple[Atom, ...]) -> tuple[Atom, ...]:
    return tuple(reversed(atoms))


def glob_match(s: str, pattern: Sequence[Piece], charge: Charge) -> bool:
    """``s`` matches the whole pattern (``case``, ``[[ $X == pat ]]``)."""
    glob = _Glob(compile_glob(pattern))
    return len(s) in glob.ends(s, 0, charge)


def remove_affix(s: str, pattern: Sequence[Piece], op: str, charge: Charge) -> str:
    """``${X#pat}`` (shortest prefix), ``##`` (longest), ``%`` (shortest suffix), ``%%`` (longest)."""
    atoms = compile_glob(pattern)
    if op in ("#", "##"):
        cuts = _Glob(atoms).ends(s, 0, charge, first_only=op == "#")
        return s[(cuts[-1] if op == "##" else cuts[0]):] if cuts else s
    back = _Glob(_reversed(atoms)).ends(s[::-1], 0, charge, first_only=op == "%")
    return s[:len(s) - (back[-1] if op == "%%" else back[0])] if back else s


def replace(s: str, pattern: Sequence[Piece], rep: str, op: str, charge: Charge) -> str:
    """``${X/pat/rep}`` (first match), ``//`` (every match), ``/#`` (at the start), ``/%`` (at the end);
    each match is the longest starting at the leftmost place one starts, as bash's."""
    atoms = compile_glob(pattern)
    if not atoms:
        return s
    if op == "/#":
        ends = _Glob(atoms).ends(s, 0, charge)
        return rep + s[ends[-1]:] if ends else s
    if op == "/%":
        back = _Glob(_reversed(atoms)).ends(s[::-1], 0, charge)
        return s[:len(s) - back[-1]] + rep if back else s
    forward = _Glob(atoms)
    can = _Glob(_reversed(atoms)).starts(s, charge)
    out: list[str] = []
    i, last = 0, 0
    while i < len(s):
        if can[i]:
            ends = [k for k in forward.ends(s, i, charge) if k > i]
            if ends:
                out.append(s[last:i])
                out.append(rep)
                i = last = ends[-1]
                if op == "/":
                    break
                continue
        i += 1
    out.append(s[last:])
    return "".join(out)


# --------------------------------------------------------------------------------------------
# [[ $X =~ RE ]]: POSIX ERE on RE2


def _ere(chars: list[tuple[str, bool]]) -> str:
    """A bash regex (each character with whether it was quoted, so literal) in RE2's syntax: bracket
    expressions rewritten (a backslash there is a member for POSIX, a leading ``]`` too); outside them a
    quoted character is escaped; the rest is the same language in both."""
    out: list[str] = []
    i = 0
    n = len(chars)
    while i < n:
        ch, literal = chars[i]
        if literal:
            out.append(_escape(ch))
            i += 1
            continue
        if ch == "\\" and i + 1 < n:
            out.append("\\" + chars[i + 1][0])
            i += 2
            continue
        if ch != "[":
            out.append(ch)
            i += 1
            continue
        j = i + 1
        body = ["["]
        if j < n and chars[j] == ("^", False):
            body.append("^")
            j += 1
        first = True
        while j < n and (chars[j] != ("]", False) or first):
            c, lit = chars[j]
            if c == "[" and not lit and j + 1 < n and chars[j + 1][0] in ":=.":
                kind = chars[j + 1][0]
                text = "".join(c2 for c2, _ in chars[j:])
                close = text.find(kind + "]", 2)
                if close < 0 or kind != ":":
                    raise _NotKnown
                body.append(text[:close + 2])
                j += close + 2
            else:
                body.append("\\" + c if c in "\\[]" or (lit and c in "^-") else c)
                j += 1
            first = False
        if j >= n:
            raise _NotKnown
        out.append("".join(body) + "]")
        i = j + 1
    return "".join(out)


def _escape(ch: str) -> str:
    return "\\" + ch if not ch.isalnum() and ch.isascii() and ch != "_" and ch.isprintable() and ch != " " else ch


@lru_cache(maxsize=256)
def _re2(pattern: str):
    import re2

    options = re2.Options()
    options.posix_syntax = True
    options.perl_classes = True  # glibc's \w \s (and RE2's \d)
    options.word_boundary = True  # glibc's \b \B
    options.never_capture = True
    options.log_errors = False  # a pattern RE2 cannot run is an undecided test, not a server log line
    try:
        return re2.compile(pattern, options)
    except re2.error:
        return None


def regex_search(s: str, pattern: Sequence[Piece], charge: Charge) -> bool:
    """``[[ s =~ pattern ]]``: quoted parts literal; raises ``_NotKnown`` for what RE2 cannot run."""
    text = _ere([(ch, p.kind in ("quoted", "verbatim")) for p in pattern for ch in p.text])
    charge(len(s) + len(text) + 1)
    compiled = _re2(text)
    if compiled is None:
        raise _NotKnown
    return compiled.search(s) is not None

"""A bash script read as bash reads it, without running anything.

Pure logic, no I/O: tree-sitter-bash (a complete bash grammar) parses the text, and ``read_script``
walks the syntax tree in the order bash would execute it, keeping a table of the variables the
script sets. What it yields is every simple command bash would reach, its words expanded as bash
expands them: quotes removed, ``$X``, ``${X:-default}``, ``${X:=x}``, ``${#ARR[@]}``, ``"${ARR[@]}"``,
``${X##*/}`` and the other parameter expansions, ``$((a*b))``, brace expansion, field splitting of
unquoted expansions, assignments (``X=1``, ``export X=1``, ``declare``, arrays ``GPUS=(0 1 2 3)``,
``+=``), ``if``/``case``/``[ ]``/``[[ ]]``/``test`` on known values, ``for`` loops over known words,
functions and their ``"$@"``.

Nothing is run, so some values cannot be known: a variable the script never assigns (it comes from
the environment), the script's own arguments (``$1``, ``"$@"``), a command's output (``$(date +%F)``),
a test on files. Those parts stay as written (``Segment.verbatim``) and are listed in ``Script``, and a
branch whose test cannot be decided is walked with every variable it sets becoming unknown. A
variable the script assigns somewhere but not before it is read is empty, as in bash with a clean
environment; ``${X:-default}`` of a variable from the environment takes the default (and is listed).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

MAX_STEPS = 200_000
"""Syntax nodes visited, loop iterations and function calls together: a bound on the work one script costs."""
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
    """Variables from the environment read as ``${X:-default}``: the script's default is used."""
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


# --------------------------------------------------------------------------------------------
# Parsing


@lru_cache(maxsize=1)
def _parser():
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


class _Source:
    """The script's text with byte offsets (tree-sitter's) turned into character offsets."""

    def __init__(self, text: str):
        self.text = text
        self.data = text.encode("utf-8", errors="surrogatepass")
        self._ascii = len(self.data) == len(text)

    def char(self, byte: int) -> int:
        if self._ascii:
            return byte
        return len(self.data[:byte].decode("utf-8", errors="surrogatepass"))

    def slice(self, node) -> str:
        return self.data[node.start_byte:node.end_byte].decode("utf-8", errors="surrogatepass")


def _errors(node, out: list) -> list:
    if node.type == "ERROR" or node.is_missing:
        out.append(node)
    if node.has_error:
        for child in node.children:
            _errors(child, out)
    return out


_WORD_END = re.compile(r"\S*")


def _syntax_error(src: _Source, root) -> ShellError:
    found = _errors(root, [])
    node = next((n for n in found if src.slice(n)[:1] in ("'", '"')), None) or next(
        (n for n in found if n.is_missing), None) or found[0]
    start = src.char(node.start_byte)
    text = src.text
    token = _WORD_END.match(text, start).group(0) or text[start:start + 1]  # type: ignore[union-attr]
    first = text[start:start + 1]
    if first == "'":
        message = "unbalanced single quote: no closing '"
    elif first == '"':
        message = 'unbalanced double quote: no closing "'
    elif node.is_missing:
        opener = {")": "$( or (", "`": "`", "}": "{", "done": "do", "fi": "if", "esac": "case"}.get(node.type, "")
        message = f"shell syntax: {node.type!r} is missing" + (f" (to close {opener})" if opener else "")
        start = src.char(node.start_byte)
        token = text[max(0, start - 20):start] or text[:20]
        start = max(0, start - len(token))
    elif text.startswith("${", start):
        message = "unclosed ${: no closing }"
    else:
        message = f"shell syntax error near {token!r}"
    return ShellError(message, token, start)


# --------------------------------------------------------------------------------------------
# Values: a scalar is a tuple of pieces; what kind each is decides brace expansion and field splitting.

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


class _Stop(Exception):
    """``exit`` (or ``return`` in a function) reached on a path that certainly runs."""

    def __init__(self, kind: str):
        self.kind = kind


class _LoopControl(Exception):
    def __init__(self, kind: str):
        self.kind = kind


# --------------------------------------------------------------------------------------------
# The walk


_SIMPLE_IGNORED = frozenset({"comment", "heredoc_body", "heredoc_start", "heredoc_end", "file_redirect",
                             "heredoc_redirect", "herestring_redirect", "\n", ";", "&", "&&", "||", "|", "|&",
                             ";;", "fi", "then", "else", "do", "done", "esac", "in"})


class _Reader:
    def __init__(self, text: str):
        self.src = _Source(text)
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

    # ---- bookkeeping

    def step(self, node) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise ShellError(f"the script takes more than {MAX_STEPS} steps to read (a loop too long?)",
                             self.src.slice(node)[:80], self.src.char(node.start_byte))

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

    # ---- statements

    def run(self, node) -> None:
        """Execute one statement (or a list of them) as bash would."""
        self.step(node)
        kind = node.type
        handler = getattr(self, "_s_" + kind, None)
        if handler is not None:
            handler(node)
        elif kind in _SIMPLE_IGNORED or not node.is_named:
            return
        else:
            raise self.fail(node, f"shell syntax {kind.replace('_', ' ')} is not supported by the import")

    def run_all(self, nodes) -> None:
        for child in nodes:
            self.run(child)

    def _s_program(self, node) -> None:
        self.run_all(node.children)

    _s_compound_statement = _s_program

    def _s_subshell(self, node) -> None:
        saved = dict(self.vars)
        try:
            self.run_all(node.children)
        finally:
            self.vars = saved

    def _s_do_group(self, node) -> None:
        self.run_all(node.children)

    def _s_redirected_statement(self, node) -> None:
        body = node.child_by_field_name("body")
        if body is not None:
            self.run(body)

    def _s_negated_command(self, node) -> None:
        self.run_all(node.named_children)

    def _s_pipeline(self, node) -> None:
        # every part runs; bash runs each in a subshell, so assignments there do not last
        for child in node.named_children:
            saved = dict(self.vars)
            try:
                self.run(child)
            finally:
                self.vars = saved

    def _s_list(self, node) -> None:
        parts = list(node.children)
        self.run(parts[0])
        status: bool | None = self.last_status(parts[0])
        i = 1
        while i + 1 < len(parts):
            op, right = parts[i].type, parts[i + 1]
            i += 2
            runs = None if status is None else (status if op == "&&" else not status)
            if runs is False:
                continue
            if runs is None:
                self.with_condition(f"{self.src.slice(parts[0])[:60]} {op}", lambda r=right: self.run(r))
                status = None
            else:
                self.run(right)
                status = self.last_status(right)

    def last_status(self, node) -> bool | None:
        """Whether a command succeeds, where that can be known: a test on known values, true/false, and any
        other command taken as succeeding (a script that runs verl expects its set-up to work)."""
        if node.type == "test_command":
            return self.test(node)
        if node.type == "negated_command":
            inner = self.last_status(node.named_children[0])
            return None if inner is None else not inner
        if node.type == "command":
            name = node.child_by_field_name("name")
            text = self.src.slice(name) if name is not None else ""
            if text == "false":
                return False
            if text in ("test", "["):
                return self.test_words([w.text for w in self.command_words(node)[1:]], node)
        if node.type == "list":
            return None
        return True

    def with_condition(self, why: str, body) -> None:
        """Walk ``body`` as a branch that may or may not run: what it assigns becomes unknown."""
        before = dict(self.vars)
        self.condition.append(why)
        try:
            body()
        except _Stop:
            pass
        except _LoopControl:
            pass
        finally:
            self.condition.pop()
        for name in set(self.vars) | set(before):
            if self.vars.get(name) is not before.get(name):
                self.vars[name] = _Unknown(f"set where `{why}` decides")

    def _s_if_statement(self, node) -> None:
        branches: list[tuple[object | None, list]] = []  # (condition nodes, body nodes)
        current_cond: list = []
        current_body: list = []
        stage = "cond"
        for child in node.children:
            t = child.type
            if t in ("if", "fi"):
                continue
            if t == "then":
                stage = "body"
                continue
            if t in ("elif_clause", "else_clause"):
                continue
            if stage == "cond":
                if child.is_named and t != "comment":
                    current_cond.append(child)
            elif child.is_named:
                current_body.append(child)
        branches.append((current_cond, current_body))
        for child in node.named_children:
            if child.type == "elif_clause":
                cond, body, stage = [], [], "cond"
                for c in child.children:
                    if c.type in ("elif",):
                        continue
                    if c.type == "then":
                        stage = "body"
                        continue
                    if c.is_named and c.type != "comment":
                        (cond if stage == "cond" else body).append(c)
                branches.append((cond, body))
            elif child.type == "else_clause":
                branches.append((None, list(child.named_children)))
        undecided: list[tuple[str, list]] = []
        for cond, body in branches:
            if cond is None:
                status: bool | None = True
                why = "else"
            else:
                self.run_all(cond)
                status = self.last_status(cond[-1]) if cond else True
                why = " ".join(self.src.slice(c) for c in cond)[:80]
            if status is None:
                undecided.append((why, body))
                continue
            if status:
                if undecided:
                    undecided.append((why, body))
                else:
                    self.run_all(body)
                    return
                break
        for why, body in undecided:
            self.with_condition(f"if {why}", lambda b=body: self.run_all(b))

    def _s_case_statement(self, node) -> None:
        subject = node.child_by_field_name("value")
        value = self.expand_string(subject) if subject is not None else ()
        items = [c for c in node.named_children if c.type == "case_item"]
        for item in items:
            patterns = [c for c in item.children if item.field_name_for_child(list(item.children).index(c)) == "value"]
            body = [c for c in item.named_children if c not in patterns]
            matched: bool | None = False
            for pattern in patterns:
                pat = self.expand_string(pattern)
                if not _known(value) or not _known(pat):
                    matched = None
                    break
                if _glob_match(_text(value), pat):
                    matched = True
                    break
            if matched is None:
                why = f"case {self.src.slice(subject)[:40] if subject is not None else ''} in " \
                      f"{'|'.join(self.src.slice(p) for p in patterns)[:40]}"
                self.with_condition(why, lambda b=body: self.run_all(b))
                continue
            if matched:
                self.run_all(body)
                return

    def _s_for_statement(self, node) -> None:
        var = node.child_by_field_name("variable")
        name = self.src.slice(var) if var is not None else "_"
        values = [c for c in node.children if node.field_name_for_child(list(node.children).index(c)) == "value"]
        body = node.child_by_field_name("body")
        if values:
            words: list[Value] = []
            for v in values:
                words.extend(self.expand_fields(v))
        else:  # for x; do ... (the positional parameters)
            words = list(self.positional) if isinstance(self.positional, list) else [(Piece("$@", "verbatim"),)]
        if any(not _known(w) for w in words) or len(words) > MAX_LOOP_ITERATIONS:
            why = f"for {name} in {' '.join(self.src.slice(v) for v in values)[:60]}"
            self.vars[name] = _Unknown(f"the loop variable of `{why}`")
            self.loops.append(why)
            try:
                self.with_condition(why, lambda: self.run(body) if body is not None else None)
            finally:
                self.loops.pop()
            return
        self.loops.append(f"for {name} in " + " ".join(_text(w) for w in words)[:60] if len(words) > 1 else "")
        try:
            for w in words:
                self.step(node)
                self.vars[name] = _stored(w)
                try:
                    if body is not None:
                        self.run(body)
                except _LoopControl as ctl:
                    if ctl.kind == "break":
                        break
        finally:
            self.loops.pop()

    def _loop_unknown(self, node) -> None:
        why = self.src.slice(node).split("\n", 1)[0][:60]
        self.loops.append(why)
        try:
            self.with_condition(why, lambda: self.run_all(
                [c for c in node.named_children if c.type == "do_group"]))
        finally:
            self.loops.pop()

    _s_while_statement = _loop_unknown
    _s_c_style_for_statement = _loop_unknown

    def _s_function_definition(self, node) -> None:
        name = node.child_by_field_name("name")
        body = node.child_by_field_name("body")
        if name is not None and body is not None:
            self.functions[self.src.slice(name)] = body

    def _s_test_command(self, node) -> None:
        return  # its status is read by the if/list that holds it

    def _s_variable_assignment(self, node) -> None:
        self.assign(node)

    def _s_variable_assignments(self, node) -> None:
        for child in node.named_children:
            self.run(child)

    def _s_declaration_command(self, node) -> None:
        keyword = node.children[0].type
        options = "".join(self.src.slice(c) for c in node.named_children if c.type == "word")
        for child in node.named_children:
            if child.type == "variable_assignment":
                self.assign(child)
                if keyword == "export" or "x" in options:
                    self.exported.add(self.assign_name(child))
            elif child.type == "variable_name":
                name = self.src.slice(child)
                if keyword == "export":
                    self.exported.add(name)
                elif name not in self.vars and keyword != "export":
                    self.vars[name] = [] if "a" in options else ()
        if "A" in options:
            self.script.note(f"line {self.line(node)}: associative arrays (declare -A) are read as indexed arrays")

    def _s_unset_command(self, node) -> None:
        for child in node.named_children:
            name = self.src.slice(child)
            if self.uncertain:
                self.vars[name] = _Unknown(f"unset where `{self.condition[-1]}` decides")
            else:
                self.vars.pop(name, None)
            self.ever_set.add(name)

    def _s_command(self, node) -> None:
        words = self.command_words(node)
        prefixes = [c for c in node.named_children if c.type == "variable_assignment"]
        assignments = []
        for p in prefixes:
            name = self.assign_name(p)
            value_node = p.child_by_field_name("value")
            value = self.expand_string(value_node) if value_node is not None else ()
            assignments.append((name, self._word(value, p)))
        if not words:
            for p in prefixes:  # `X=1` alone is an assignment; tree-sitter sometimes wraps it as a command
                self.assign(p)
            return
        name = words[0].text
        if name in self.functions and not words[0].verbatim:
            self.call(node, self.functions[name], words[1:])
            return
        builtin = getattr(self, "_b_" + name.replace("-", "_").replace(".", "dot"), None) \
            if name and not words[0].verbatim and (name.isidentifier() or name == ".") else None
        if builtin is not None and builtin(node, words):
            return
        self.record(node, words, tuple(assignments))

    def record(self, node, words: list[Word], assignments: tuple) -> None:
        loop = next((w for w in reversed(self.loops) if w), None)
        self.script.commands.append(Command(
            words=tuple(words), assignments=assignments, raw=self.src.slice(node),
            position=self.src.char(node.start_byte), line=self.line(node),
            condition=self.condition[-1] if self.condition else None, repeated=loop))

    def call(self, node, body, args: list[Word]) -> None:
        if self.depth >= MAX_CALL_DEPTH:
            raise self.fail(node, f"functions call each other more than {MAX_CALL_DEPTH} deep")
        saved = self.positional
        self.positional = [tuple(Piece(s.text, "verbatim" if s.verbatim else "quoted") for s in w.segments) or
                           (Piece(w.text, "quoted"),) for w in args]
        self.depth += 1
        try:
            self.run(body)
        except _Stop as stop:
            if stop.kind == "exit":
                raise
        finally:
            self.depth -= 1
            self.positional = saved

    # ---- builtins that change what the walk knows; each returns True when it handled the command

    def _b_exit(self, node, words: list[Word]) -> bool:
        if not self.uncertain:
            raise _Stop("exit")
        return True

    def _b_return(self, node, words: list[Word]) -> bool:
        if not self.uncertain and self.depth:
            raise _Stop("return")
        return True

    def _b_break(self, node, words: list[Word]) -> bool:
        if not self.uncertain and self.loops:
            raise _LoopControl("break")
        return True

    def _b_continue(self, node, words: list[Word]) -> bool:
        if not self.uncertain and self.loops:
            raise _LoopControl("continue")
        return True

    def _b_shift(self, node, words: list[Word]) -> bool:
        count = int(words[1].text) if len(words) > 1 and words[1].text.isdigit() else 1
        if isinstance(self.positional, list):
            self.positional = self.positional[count:]
        return True

    def _b_set(self, node, words: list[Word]) -> bool:
        args = [w.text for w in words[1:]]
        if "--" in args:
            self.positional = [(Piece(w.text, "quoted"),) for w in words[1 + args.index("--") + 1:]]
        return False  # still recorded: set -x is a command the caller may list

    def _b_source(self, node, words: list[Word]) -> bool:
        shown = " ".join(w.text for w in words)[:60]
        self.script.note(f"line {self.line(node)}: not read: {shown} (a file: what it sets is unknown here)")
        return False

    _b_dot = _b_source

    def _b_eval(self, node, words: list[Word]) -> bool:
        self.script.note(f"line {self.line(node)}: not run: {' '.join(w.text for w in words)[:60]}")
        return False

    def _b_read(self, node, words: list[Word]) -> bool:
        takes_value = {"-d", "-n", "-N", "-p", "-t", "-u", "-i"}
        skip = False
        for w in words[1:]:
            if skip:
                skip = False
                continue
            if w.text.startswith("-"):
                skip = w.text in takes_value
                continue
            if w.text.isidentifier():
                self.vars[w.text] = _Unknown(f"read by `{self.src.slice(node)[:40]}`")
        return False

    _b_mapfile = _b_read
    _b_readarray = _b_read

    # ---- assignments

    def assign_name(self, node) -> str:
        name = node.child_by_field_name("name")
        if name is None:
            return ""
        if name.type == "subscript":
            inner = name.child_by_field_name("name")
            return self.src.slice(inner) if inner is not None else self.src.slice(name)
        return self.src.slice(name)

    def assign(self, node) -> None:
        name_node = node.child_by_field_name("name")
        value_node = node.child_by_field_name("value")
        name = self.assign_name(node)
        append = any(c.type == "+=" for c in node.children)
        if not name:
            return
        if value_node is not None and value_node.type == "array":
            items: list[Value] = []
            for element in value_node.named_children:
                if element.type == "comment":
                    continue
                items.extend(_stored(v) for v in self.expand_fields(element))
                if len(items) > MAX_WORDS:
                    raise self.fail(value_node, f"an array of more than {MAX_WORDS} elements")
            old = self.vars.get(name)
            if append and isinstance(old, list):
                items = old + items
            elif append and isinstance(old, tuple) and old:
                items = [old, *items]
            self.set_var(name, items)
            return
        value = _stored(self.expand_string(value_node)) if value_node is not None else ()
        if name_node is not None and name_node.type == "subscript":  # A[i]=x
            old = self.vars.get(name)
            index = self.arith_text(self.src.slice(name_node.child_by_field_name("index")), name_node)
            if isinstance(old, list) and isinstance(index, int) and 0 <= index <= len(old) and index < MAX_WORDS:
                new = list(old)
                new[index:index + 1] = [value]
                self.set_var(name, new)
            else:
                self.set_var(name, _Unknown(f"an element assignment {self.src.slice(node)[:40]}"))
            return
        if append:
            old = self.vars.get(name)
            if isinstance(old, tuple):
                value = _stored(old + value)
            elif isinstance(old, list):
                self.set_var(name, [*old, value])
                return
            elif isinstance(old, _Unknown):
                return
        self.set_var(name, value)

    def set_var(self, name: str, value: _Var) -> None:
        self.ever_set.add(name)
        if isinstance(value, tuple) and len(_text(value)) > MAX_VALUE_CHARS:
            raise ShellError(f"variable {name} grows past {MAX_VALUE_CHARS} characters", name, 0)
        self.vars[name] = value

    # ---- words

    def command_words(self, node) -> list[Word]:
        targets = []
        for index, child in enumerate(node.children):
            field_name = node.field_name_for_child(index)
            if child.type == "command_name":
                targets.append(child.named_children[0] if child.named_children else child)
            elif field_name == "argument":
                targets.append(child)
        # tree-sitter-bash cuts some words in two (``key=[$HOME/a]`` loses its ``$``): nodes with no space
        # between them are one word for bash, read again on their own.
        groups: list[list] = []
        for target in targets:
            gap = self.src.data[groups[-1][-1].end_byte:target.start_byte] if groups else b" "
            if not re.search(rb"\s", gap):
                groups[-1].append(target)
            else:
                groups.append([target])
        words: list[Word] = []
        for group in groups:
            for value in self.group_fields(group):
                words.append(self._word(value, group[0], end=group[-1].end_byte))
                if len(words) > MAX_WORDS:
                    raise self.fail(node, f"a command of more than {MAX_WORDS} words")
        return words

    def group_fields(self, group: list) -> list[Value]:
        """One bash word that tree-sitter-bash cut into several nodes: it drops a ``$`` after ``[`` or
        after an expansion and ``,`` (``key=[$A,$B]``). Read again with ``$NAME`` written ``${NAME}``,
        which bash reads the same and the grammar keeps whole."""
        if len(group) == 1:
            return self.expand_fields(group[0])
        text = self.src.data[group[0].start_byte:group[-1].end_byte].decode("utf-8", errors="surrogatepass")
        if any(c in text for c in "'\"\\`"):
            raise self.fail(group[0], f"cannot read the shell word {text[:80]}: quote it")
        synthetic = ": " + re.sub(r"\$([A-Za-z_][A-Za-z0-9_]*)", r"${\1}", text)
        tree = _parser().parse(synthetic.encode("utf-8", errors="surrogatepass"))
        command = _first(tree.root_node, "command")
        args = [c for i, c in enumerate(command.children) if command.field_name_for_child(i) == "argument"] \
            if command is not None else []
        whole = len(synthetic.encode("utf-8", errors="surrogatepass"))
        if tree.root_node.has_error or len(args) != 1 or args[0].end_byte != whole:
            raise self.fail(group[0], f"cannot read the shell word {text[:80]}: quote it")
        sub = _Reader.__new__(_Reader)
        sub.__dict__.update(self.__dict__)
        sub.src = _Source(synthetic)
        return sub.expand_fields(args[0])

    def _word(self, value: Value, node, end: int | None = None) -> Word:
        segments: list[Segment] = []
        for piece in value:
            verbatim = piece.kind == "verbatim"
            if segments and segments[-1].verbatim == verbatim:
                segments[-1] = Segment(segments[-1].text + piece.text, verbatim)
            elif piece.text:
                segments.append(Segment(piece.text, verbatim))
        raw = self.src.data[node.start_byte:end if end is not None else node.end_byte].decode(
            "utf-8", errors="surrogatepass")
        return Word(_text(value), raw, self.src.char(node.start_byte), tuple(segments))

    def expand_string(self, node) -> Value:
        """A word expanded without brace expansion or field splitting (assignment values, case subjects)."""
        pieces = self.pieces(node, quoted=False)
        return tuple(p for p in pieces if p is not _FIELD_BREAK)

    def expand_fields(self, node) -> list[Value]:
        """A word expanded into the fields bash makes of it: brace expansion, then field splitting."""
        out: list[Value] = []
        for variant in _brace_expand(self.pieces(node, quoted=False), self, node):
            out.extend(_split_fields(variant, self.ifs()))
        return out

    def ifs(self) -> str:
        value = self.vars.get("IFS")
        if isinstance(value, tuple) and _known(value):
            return _text(value)
        return " \t\n"

    def pieces(self, node, quoted: bool) -> list[Piece]:
        """The pieces of a word node, expansions evaluated."""
        self.step(node)
        t = node.type
        text = self.src.slice(node)
        if t in ("word", "number", "extglob_pattern", "regex", "test_operator", "variable_name"):
            return _unescape_unquoted(text) if not quoted else [Piece(text, "quoted")]
        if t == "raw_string":
            return [Piece(text[1:-1], "quoted")]
        if t == "ansi_c_string":
            return [Piece(_ansi_c(text[2:-1]), "quoted")]
        if t in ("string", "translated_string"):
            return self.string_pieces(node)
        if t == "string_content":
            return [Piece(_unescape_double(text), "quoted")]
        if t in ("concatenation", "brace_expression"):
            out: list[Piece] = []
            last = node.start_byte
            for child in node.children:
                if child.start_byte > last:  # source between the children (tree-sitter leaves no node for it)
                    gap = self.src.data[last:child.start_byte].decode("utf-8", errors="surrogatepass")
                    out.extend(_unescape_unquoted(gap) if not quoted else [Piece(gap, "quoted")])
                out.extend(self.pieces(child, quoted) if child.is_named else
                           (_unescape_unquoted(self.src.slice(child)) if not quoted else
                            [Piece(self.src.slice(child), "quoted")]))
                last = child.end_byte
            return out
        if t == "simple_expansion":
            inner = node.named_children[0] if node.named_children else None
            name = self.src.slice(inner) if inner is not None else text[1:]
            return self.parameter(name, None, quoted, node)
        if t == "expansion":
            return self.expansion(node, quoted)
        if t == "arithmetic_expansion":
            result = self.arith_node(node)
            return [Piece(str(result), "quoted" if quoted else "split")] if result is not None else \
                [Piece(text, "verbatim")]
        if t == "command_substitution":
            if text.startswith("$((") and text.endswith("))"):  # tree-sitter reads $((..)) in ${:-} this way
                result = self.arith_text(text[3:-2], node)
                if result is not None:
                    return [Piece(str(result), "quoted" if quoted else "split")]
            self._add(self.script.substitutions, text)
            return [Piece(text, "verbatim")]
        if t == "process_substitution":
            self._add(self.script.substitutions, text)
            return [Piece(text, "verbatim")]
        if t == "comment":
            return []
        if not node.is_named:
            return _unescape_unquoted(text) if not quoted else [Piece(text, "quoted")]
        raise self.fail(node, f"shell syntax {t.replace('_', ' ')} is not supported here by the import")

    def string_pieces(self, node) -> list[Piece]:
        """A double-quoted string: its text and expansions, the quotes removed."""
        children = list(node.children)
        start = node.start_byte + (2 if self.src.slice(node).startswith('$"') else 1)
        end = node.end_byte - 1
        out: list[Piece] = []
        last = start
        for child in children:
            if child.start_byte < start or child.end_byte > end or not child.is_named:
                continue
            if child.start_byte > last:
                gap = self.src.data[last:child.start_byte].decode("utf-8", errors="surrogatepass")
                out.append(Piece(_unescape_double(gap), "quoted"))
            out.extend(self.pieces(child, quoted=True))
            last = child.end_byte
        if end > last:
            gap = self.src.data[last:end].decode("utf-8", errors="surrogatepass")
            out.append(Piece(_unescape_double(gap), "quoted"))
        return out or [Piece("", "quoted")]

    # ---- parameters

    def lookup(self, name: str, node) -> _Var | _Positional | None:
        """A variable's value; None when unset. Environment variables and script arguments are
        recorded and come back as ``_Unknown``."""
        if name in ("@", "*"):
            if isinstance(self.positional, list):
                return self.positional
            self._add(self.script.arguments, "$" + name)
            return _Positional()
        if name.isdigit():
            if name == "0":
                return _Unknown("the script's name")
            if isinstance(self.positional, list):
                index = int(name) - 1
                return self.positional[index] if index < len(self.positional) else None
            self._add(self.script.arguments, "$" + name)
            return _Unknown("a script argument")
        if name == "#":
            if isinstance(self.positional, list):
                return (Piece(str(len(self.positional)), "quoted"),)
            self._add(self.script.arguments, "$#")
            return _Unknown("the number of script arguments")
        if name == "?":
            return (Piece("0", "quoted"),)
        if name in ("$", "!", "-", "RANDOM", "SECONDS", "LINENO", "BASHPID", "PPID"):
            return _Unknown(f"${name} changes from run to run")
        if name in self.vars:
            return self.vars[name]
        if name in self.assigned_anywhere:
            return None  # the script sets it, but not before this point: empty, as bash sees it
        return _Unknown("environment")

    def _verbatim(self, text: str, value: _Unknown, name: str) -> list[Piece]:
        if value.reason == "environment":
            self._add(self.script.environment, name)
        return [Piece(text, "verbatim")]

    def parameter(self, name: str, index: str | None, quoted: bool, node) -> list[Piece]:
        """``$name`` / ``${name}`` / ``${name[index]}``, expanded."""
        text = self.src.slice(node)
        value = self.lookup(name, node)
        if isinstance(value, _Positional):
            return [Piece(text, "verbatim")]
        if isinstance(value, _Unknown):
            return self._verbatim(text, value, name)
        if value is None:
            return [Piece("", "quoted" if quoted else "split")]
        if isinstance(value, list):
            if name in ("@", "*"):
                return self.join_items(value, name == "*", quoted)
            if index is None:
                items = value[:1]
            elif index in ("@", "*"):
                items = value
            else:
                i = self.arith_text(index, node)
                if i is None:
                    return [Piece(text, "verbatim")]
                items = [value[i]] if -len(value) <= i < len(value) else []
            return self.join_items(items, index == "*", quoted)
        if index not in (None, "0", "@", "*"):
            i = self.arith_text(index, node)
            if i is None:
                return [Piece(text, "verbatim")]
            if i != 0:
                return [Piece("", "quoted" if quoted else "split")]
        return _requote(value, quoted)

    def join_items(self, items: list[Value], star: bool, quoted: bool) -> list[Piece]:
        """Array elements: ``"${A[@]}"`` keeps each a field; ``"${A[*]}"`` joins them with IFS's first
        character; unquoted, each is split."""
        out: list[Piece] = []
        for k, item in enumerate(items):
            if k:
                if star and quoted:
                    out.append(Piece(self.ifs()[:1], "quoted"))
                elif quoted:
                    out.append(_FIELD_BREAK)
                else:
                    out.append(Piece(" ", "split"))
            out.extend(_requote(item, quoted))
        return out or [Piece("", "quoted" if quoted else "split")]

    def expansion(self, node, quoted: bool) -> list[Piece]:
        """``${...}``: every form bash has that a dry run can evaluate."""
        text = self.src.slice(node)
        inner = [c for c in node.children if c.type not in ("${", "}")]
        prefix = None
        if inner and not inner[0].is_named and inner[0].type in ("#", "!"):
            prefix = inner[0].type
            inner = inner[1:]
        if not inner:
            if prefix == "#":
                return _requote_text(self.lookup("#", node), text, quoted, self)
            raise self.fail(node, f"cannot read the parameter expansion {text}")
        target = inner[0]
        rest = inner[1:]
        index = None
        if target.type == "subscript":
            name_node = target.child_by_field_name("name")
            index_node = target.child_by_field_name("index")
            name = self.src.slice(name_node) if name_node is not None else ""
            index = self.src.slice(index_node) if index_node is not None else "0"
        elif target.type in ("variable_name", "special_variable_name", "number", "word"):
            name = self.src.slice(target)
        else:
            raise self.fail(node, f"cannot read the parameter expansion {text}")
        if prefix == "#":  # length
            value = self.lookup(name, node)
            if isinstance(value, (_Unknown, _Positional)):
                if isinstance(value, _Unknown):
                    self._verbatim(text, value, name)
                return [Piece(text, "verbatim")]
            if isinstance(value, list):
                n = len(value) if index in ("@", "*") else (len(_text(value[0])) if value else 0)
            elif value is None:
                n = 0
            elif not _known(value):
                return [Piece(text, "verbatim")]
            else:
                n = len(_text(value))
            return [Piece(str(n), "quoted" if quoted else "split")]
        if prefix == "!":  # indirection
            value = self.lookup(name, node)
            if not isinstance(value, tuple) or not _known(value):
                if isinstance(value, _Unknown):
                    self._verbatim(text, value, name)
                return [Piece(text, "verbatim")]
            name = _text(value)
        if not rest:
            return self.parameter(name, index, quoted, node)
        op = rest[0].type if not rest[0].is_named else ""
        operands = [c for c in rest[1:] if c.is_named or c.type not in ("/", ":")]
        value = self.lookup(name, node)
        # ${X:-default} of a variable not set yet (by the environment, or later by the script) takes the default
        from_env = (isinstance(value, _Unknown) and value.reason == "environment") or (
            value is None and name not in self.ever_set and name.isidentifier())
        current = None if value is None else value
        if op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            word = self.operand(operands, quoted)
            if isinstance(current, (_Unknown, _Positional)) and not from_env:
                return [Piece(text, "verbatim")]
            if from_env:
                if op in (":?", "?"):  # the script stops without it: it must come from the environment
                    return self._verbatim(text, _Unknown("environment"), name)
                self._add(self.script.defaults, name)
                current = None
            scalar = _scalar(current, index)
            is_set = current is not None
            empty = scalar is None or _text(scalar) == ""
            use_word = (not is_set) if op in ("-", "=", "?") else (empty if op in (":-", ":=", ":?") else None)
            if op in (":+", "+"):
                take = is_set if op == "+" else not empty
                return word if take else [Piece("", "quoted" if quoted else "split")]
            if use_word:
                if op in (":=", "="):
                    self.set_var(name, _stored(tuple(word)))
                return word
            return self.parameter(name, index, quoted, node)
        if isinstance(current, _Unknown):
            return self._verbatim(text, current, name)
        if isinstance(current, _Positional):
            return [Piece(text, "verbatim")]
        scalar = _scalar(current, index) or ()
        if not _known(scalar):
            return [Piece(text, "verbatim")]
        s = _text(scalar)
        kind: Kind = "quoted" if quoted else "split"
        if op in ("#", "##", "%", "%%"):
            pattern = self.operand(operands, False)
            if not _known(tuple(pattern)):
                return [Piece(text, "verbatim")]
            return [Piece(_remove_affix(s, _pattern_regex(pattern), op), kind)]
        if op in ("/", "//", "/#", "/%"):
            pattern_nodes = [c for c in rest[1:] if c.is_named]
            pat = self.operand(pattern_nodes[:1], False)
            rep = self.operand(pattern_nodes[1:2], True)
            if not _known(tuple(pat)) or not _known(tuple(rep)):
                return [Piece(text, "verbatim")]
            return [Piece(_replace(s, _pattern_regex(pat), _text(tuple(rep)), op), kind)]
        if op in (",,", "^^", ",", "^"):
            changed = {",,": s.lower(), "^^": s.upper(), ",": s[:1].lower() + s[1:], "^": s[:1].upper() + s[1:]}[op]
            return [Piece(changed, kind)]
        if op == ":":
            numbers = [c for c in rest[1:] if c.is_named]
            offset = self.arith_text(self.src.slice(numbers[0]), node) if numbers else 0
            length = self.arith_text(self.src.slice(numbers[1]), node) if len(numbers) > 1 else None
            if offset is None or (len(numbers) > 1 and length is None):
                return [Piece(text, "verbatim")]
            start = offset if offset >= 0 else max(0, len(s) + offset)
            stop = len(s) if length is None else (start + length if length >= 0 else len(s) + length)
            return [Piece(s[start:stop], kind)]
        self.script.note(f"line {self.line(node)}: not expanded: {text}")
        return [Piece(text, "verbatim")]

    def operand(self, nodes, quoted: bool) -> list[Piece]:
        out: list[Piece] = []
        for n in nodes:
            for p in self.pieces(n, quoted):
                out.append(Piece(p.text, "split") if p.kind == "lit" and not quoted else p)
        return out

    # ---- arithmetic

    def arith_text(self, expr: str | None, node) -> int | None:
        """An arithmetic expression's value from its text (an array index, ``${X:1:2}``), or None."""
        if expr is None:
            return None
        expr = expr.strip()
        if re.fullmatch(r"-?\d+", expr):
            return int(expr)
        tree = _parser().parse(f": $(({expr}))".encode("utf-8", errors="surrogatepass"))
        found = _first(tree.root_node, "arithmetic_expansion")
        if found is None or tree.root_node.has_error:
            return None
        sub = _Reader.__new__(_Reader)
        sub.__dict__.update(self.__dict__)
        sub.src = _Source(f": $(({expr}))")
        return sub.arith_node(found)

    def arith_node(self, node) -> int | None:
        inner = list(node.named_children)
        if not inner:
            return 0
        try:
            return self.arith(inner[-1])
        except _NotKnown:
            return None
        except ZeroDivisionError:
            raise self.fail(node, "division by zero in an arithmetic expansion") from None

    def arith(self, node) -> int:
        self.step(node)
        t = node.type
        if t == "number":
            return _int_literal(self.src.slice(node))
        if t in ("variable_name", "word"):
            return self.arith_var(self.src.slice(node), node)
        if t in ("simple_expansion", "expansion"):
            pieces = self.pieces(node, quoted=True)
            if not _known(tuple(pieces)):
                raise _NotKnown
            text = "".join(p.text for p in pieces).strip()
            return self.arith_value(text, node)
        if t == "parenthesized_expression":
            return self.arith(node.named_children[0])
        if t == "unary_expression":
            op = node.children[0].type
            v = self.arith(node.named_children[-1])
            return _wrap({"-": -v, "+": v, "!": int(not v), "~": ~v}.get(op, v))
        if t == "binary_expression":
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            op_node = node.child_by_field_name("operator")
            op = op_node.type if op_node is not None else ""
            if op == "&&":
                return int(bool(self.arith(left)) and bool(self.arith(right)))
            if op == "||":
                return int(bool(self.arith(left)) or bool(self.arith(right)))
            a, b = self.arith(left), self.arith(right)
            return _binary(op, a, b)
        if t == "ternary_expression":
            cond, then, other = node.named_children[:3]
            return self.arith(then) if self.arith(cond) else self.arith(other)
        if t == "arithmetic_expansion":
            return self.arith(node.named_children[-1])
        raise _NotKnown

    def arith_var(self, name: str, node) -> int:
        value = self.lookup(name, node)
        if isinstance(value, _Unknown):
            if value.reason == "environment":
                self._add(self.script.environment, name)
            raise _NotKnown
        if isinstance(value, _Positional):
            raise _NotKnown
        if value is None:
            return 0
        scalar = _scalar(value, None) or ()
        if not _known(scalar):
            raise _NotKnown
        return self.arith_value(_text(scalar).strip(), node)

    def arith_value(self, text: str, node) -> int:
        if text == "":
            return 0
        try:
            return _int_literal(text)
        except _NotKnown:
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) and self.depth < MAX_CALL_DEPTH:
                self.depth += 1
                try:
                    return self.arith_var(text, node)
                finally:
                    self.depth -= 1
            result = self.arith_text(text, node)
            if result is None:
                raise
            return result

    # ---- tests

    def test(self, node) -> bool | None:
        """``[ ... ]`` / ``[[ ... ]]`` on known values; None when it depends on what is not known."""
        exprs = [c for c in node.named_children if c.type != "comment"]
        if not exprs:
            return False
        try:
            return self.test_expr(exprs[0], extended=self.src.slice(node).startswith("[["))
        except _NotKnown:
            return None

    def test_value(self, node) -> str:
        pieces = self.pieces(node, quoted=False)
        if not _known(tuple(pieces)):
            raise _NotKnown
        return "".join(p.text for p in pieces)

    def test_expr(self, node, extended: bool) -> bool:
        t = node.type
        if t == "parenthesized_expression":
            return self.test_expr(node.named_children[0], extended)
        if t == "unary_expression":
            op_node = node.child_by_field_name("operator") or node.children[0]
            op = self.src.slice(op_node)
            operand = node.named_children[-1]
            if op == "!":
                return not self.test_expr(operand, extended)
            if op in ("-z", "-n"):
                value = self.test_value(operand)
                return (value == "") if op == "-z" else (value != "")
            raise _NotKnown  # file tests, -v, ...
        if t == "binary_expression":
            op_node = node.child_by_field_name("operator")
            op = self.src.slice(op_node) if op_node is not None else ""
            left, right = node.child_by_field_name("left"), node.child_by_field_name("right")
            if op in ("&&", "-a"):
                return self.test_expr(left, extended) and self.test_expr(right, extended)
            if op in ("||", "-o"):
                return self.test_expr(left, extended) or self.test_expr(right, extended)
            a = self.test_value(left)
            if op in ("=", "==", "!=") and extended:
                pattern = self.pieces(right, quoted=False)
                if not _known(tuple(pattern)):
                    raise _NotKnown
                return _glob_match(a, tuple(pattern)) == (op != "!=")
            b = self.test_value(right)
            return _compare(op, a, b)
        if t == "negated_command":
            return not self.test_expr(node.named_children[0], extended)
        return self.test_value(node) != ""

    def test_words(self, args: list[str], node) -> bool | None:
        """``test``/``[`` as a plain command, on its expanded words."""
        if args and args[-1] == "]":
            args = args[:-1]
        try:
            if not args:
                return False
            if args[0] == "!":
                inner = self.test_words(args[1:], node)
                return None if inner is None else not inner
            if len(args) == 1:
                return args[0] != ""
            if len(args) == 2 and args[0] in ("-z", "-n"):
                return (args[1] == "") == (args[0] == "-z")
            if len(args) == 3:
                return _compare(args[1], args[0], args[2])
        except _NotKnown:
            return None
        return None


class _NotKnown(Exception):
    """An arithmetic or test operand whose value is not known here."""


# --------------------------------------------------------------------------------------------
# Small pure helpers


def _first(node, kind: str):
    if node.type == kind:
        return node
    for child in node.children:
        found = _first(child, kind)
        if found is not None:
            return found
    return None


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


def _requote_text(value, text: str, quoted: bool, reader: _Reader) -> list[Piece]:
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


def _int_literal(text: str) -> int:
    text = text.strip()
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-")
    try:
        if re.fullmatch(r"0[xX][0-9A-Fa-f]+", body):
            return _wrap(sign * int(body, 16))
        if re.fullmatch(r"0[0-7]+", body):
            return _wrap(sign * int(body, 8))
        if re.fullmatch(r"\d+", body):
            return _wrap(sign * int(body))
        m = re.fullmatch(r"(\d+)#([0-9A-Za-z@_]+)", body)
        if m and 2 <= int(m.group(1)) <= 36:
            return _wrap(sign * int(m.group(2), int(m.group(1))))
    except ValueError:
        pass
    raise _NotKnown


def _wrap(v: int) -> int:
    """bash arithmetic is 64-bit and wraps around."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _binary(op: str, a: int, b: int) -> int:
    if op in ("/", "%") and b == 0:
        raise ZeroDivisionError
    if op == "/":
        return _wrap(abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1))
    if op == "%":
        return _wrap(abs(a) % abs(b) * (1 if a >= 0 else -1))
    if op == "**":
        if b < 0:
            raise _NotKnown
        return _wrap(pow(a, b, 1 << 64))
    table = {
        "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
        "<<": lambda: a << min(b, 64) if b >= 0 else 0, ">>": lambda: a >> min(b, 64) if b >= 0 else 0,
        "&": lambda: a & b, "|": lambda: a | b, "^": lambda: a ^ b,
        "<": lambda: int(a < b), "<=": lambda: int(a <= b), ">": lambda: int(a > b), ">=": lambda: int(a >= b),
        "==": lambda: int(a == b), "!=": lambda: int(a != b),
    }
    if op not in table:
        raise _NotKnown
    return _wrap(table[op]())


def _compare(op: str, a: str, b: str) -> bool:
    if op in ("=", "=="):
        return a == b
    if op == "!=":
        return a != b
    if op == "<":
        return a < b
    if op == ">":
        return a > b
    if op in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
        x, y = _int_literal(a or "0"), _int_literal(b or "0")
        return {"-eq": x == y, "-ne": x != y, "-lt": x < y, "-le": x <= y, "-gt": x > y, "-ge": x >= y}[op]
    if op == "=~":
        try:
            return re.search(b, a) is not None
        except re.error:
            raise _NotKnown from None
    raise _NotKnown


def _glob_regex(glob: str) -> str:
    """One unquoted stretch of a bash pattern: ``*``, ``?`` and ``[...]`` (``[!...]``, ``[^...]``)."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        ch = glob[i]
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "[":
            close = glob.find("]", i + 2 if glob[i + 1:i + 2] in ("!", "^") else i + 1)
            if close < 0:
                out.append(re.escape(ch))
            else:
                body = glob[i + 1:close]
                negate = body[:1] in ("!", "^")
                body = body[1:] if negate else body
                out.append("[" + ("^" if negate else "") + body.replace("\\", "\\\\") + "]")
                i = close
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def _pattern_regex(pieces: list[Piece]) -> str:
    """A bash glob pattern (quoted parts literal) as a regular expression."""
    return "".join(re.escape(p.text) if p.kind in ("quoted", "verbatim") else _glob_regex(p.text) for p in pieces)


def _glob_match(value: str, pattern: tuple[Piece, ...] | Value) -> bool:
    try:
        return re.fullmatch(_pattern_regex(list(pattern)), value, flags=re.S) is not None
    except re.error:
        return value == _text(tuple(pattern))


def _remove_affix(s: str, regex: str, op: str) -> str:
    try:
        compiled = re.compile(regex, re.S)
    except re.error:
        return s
    if op in ("#", "##"):
        cuts = [k for k in range(len(s) + 1) if compiled.fullmatch(s[:k])]
        if not cuts:
            return s
        return s[(max(cuts) if op == "##" else min(cuts)):]
    cuts = [k for k in range(len(s) + 1) if compiled.fullmatch(s[k:])]
    if not cuts:
        return s
    return s[:(min(cuts) if op == "%%" else max(cuts))]


def _replace(s: str, regex: str, rep: str, op: str) -> str:
    if not regex:
        return s
    try:
        compiled = re.compile(regex, re.S)
    except re.error:
        return s
    if op == "/#":
        for k in range(len(s), -1, -1):
            if compiled.fullmatch(s[:k]):
                return rep + s[k:]
        return s
    if op == "/%":
        for k in range(len(s) + 1):
            if compiled.fullmatch(s[k:]):
                return s[:k] + rep
        return s
    out, i, replaced = [], 0, False
    while i <= len(s):
        match = None
        if not replaced or op == "//":
            for k in range(len(s), i, -1):  # longest match, as bash
                if compiled.fullmatch(s[i:k]):
                    match = k
                    break
        if match is not None:
            out.append(rep)
            i = match
            replaced = True
            continue
        if i < len(s):
            out.append(s[i])
        i += 1
    return "".join(out)


def _split_fields(value: list[Piece], ifs: str) -> list[Value]:
    """Field splitting: ``split`` pieces break on IFS; a field made only of empty expansions vanishes;
    ``"${A[@]}"`` breaks where the array's elements meet."""
    fields: list[list[Piece]] = [[]]
    has_text = [False]
    whitespace = "".join(c for c in ifs if c in " \t\n")
    others = "".join(c for c in ifs if c not in " \t\n")
    for piece in value:
        if piece is _FIELD_BREAK:
            fields.append([])
            has_text.append(True)
            continue
        if piece.kind != "split" or not ifs:
            fields[-1].append(piece)
            if piece.kind != "split" or piece.text:
                has_text[-1] = True
            continue
        buf: list[str] = []
        for ch in piece.text:
            if ch in whitespace:
                if buf or has_text[-1]:
                    fields[-1].append(Piece("".join(buf), "quoted"))
                    has_text[-1] = True
                    buf = []
                    fields.append([])
                    has_text.append(False)
            elif ch in others:
                fields[-1].append(Piece("".join(buf), "quoted"))
                has_text[-1] = True
                buf = []
                fields.append([])
                has_text.append(False)
            else:
                buf.append(ch)
        if buf:
            fields[-1].append(Piece("".join(buf), "quoted"))
            has_text[-1] = True
    return [tuple(f) for f, keep in zip(fields, has_text, strict=True) if keep]


# --------------------------------------------------------------------------------------------
# Brace expansion


_SEQUENCE = re.compile(r"^(-?\d+|[A-Za-z])\.\.(-?\d+|[A-Za-z])(?:\.\.(-?\d+))?$")


def _atoms(pieces: list[Piece]) -> list[Piece]:
    """Pieces with ``lit`` text cut into one-character pieces, so braces and commas can be found."""
    out: list[Piece] = []
    for p in pieces:
        if p.kind == "lit":
            out.extend(Piece(c, "lit") for c in p.text)
        else:
            out.append(p)
    return out


def _is(atom: Piece, ch: str) -> bool:
    return atom.kind == "lit" and atom.text == ch


def _brace_expand(pieces: list[Piece], reader: _Reader, node) -> list[list[Piece]]:
    if not any(p.kind == "lit" and "{" in p.text for p in pieces):
        return [pieces]
    atoms = _atoms(pieces)
    out = _expand_atoms(atoms, reader, node)
    if len(out) > 1:
        text = reader.src.slice(node)
        reader.script.note(f"line {reader.line(node)}: bash brace expansion makes {len(out)} words of "
                           f"{text[:60]} (quote it to keep one word)")
    return out


def _expand_atoms(atoms: list[Piece], reader: _Reader, node) -> list[list[Piece]]:
    for i, atom in enumerate(atoms):
        if not _is(atom, "{") or (i and _is(atoms[i - 1], "$")):
            continue
        depth, commas, j = 0, [], i
        for j in range(i, len(atoms)):
            if _is(atoms[j], "{"):
                depth += 1
            elif _is(atoms[j], "}"):
                depth -= 1
                if depth == 0:
                    break
            elif _is(atoms[j], ",") and depth == 1:
                commas.append(j)
        else:
            continue
        if depth != 0:
            continue
        body = atoms[i + 1:j]
        prefix, suffix = atoms[:i], atoms[j + 1:]
        alternatives: list[list[Piece]]
        if commas:
            bounds = [i, *commas, j]
            alternatives = [atoms[a + 1:b] for a, b in itertools.pairwise(bounds)]
        else:
            seq = _SEQUENCE.match("".join(a.text for a in body)) if all(a.kind == "lit" for a in body) else None
            if seq is None:
                continue
            alternatives = [[Piece(s, "quoted")] for s in _sequence(seq)]
        results: list[list[Piece]] = []
        for alt in alternatives:
            for tail in _expand_atoms(alt + suffix, reader, node):
                results.append(prefix + tail)
                if len(results) > MAX_WORDS:
                    raise reader.fail(node, f"brace expansion makes more than {MAX_WORDS} words")
        return results
    return [atoms]


def _sequence(m: re.Match) -> list[str]:
    a, b, step = m.group(1), m.group(2), m.group(3)
    inc = abs(int(step)) if step and int(step) else 1
    if a.lstrip("-").isdigit() and b.lstrip("-").isdigit():
        x, y = int(a), int(b)
        if abs(y - x) // inc > MAX_WORDS:
            return [m.group(0)]
        width = max(len(a), len(b)) if (a.lstrip("-").startswith("0") and len(a.lstrip("-")) > 1) or \
            (b.lstrip("-").startswith("0") and len(b.lstrip("-")) > 1) else 0
        rng = range(x, y + 1, inc) if x <= y else range(x, y - 1, -inc)
        return [str(v).zfill(width) if width else str(v) for v in rng]
    if a.isalpha() and b.isalpha():
        x, y = ord(a), ord(b)
        rng = range(x, y + 1, inc) if x <= y else range(x, y - 1, -inc)
        return [chr(v) for v in rng]
    return [m.group(0)]


# --------------------------------------------------------------------------------------------
# Entry point


def _assigned_names(node, src: _Source, out: set[str]) -> set[str]:
    """Every variable the script sets anywhere (assignments, for loops, read targets, ${X:=})."""
    stack = [node]
    while stack:
        n = stack.pop()
        if n.type == "variable_assignment":
            name = n.child_by_field_name("name")
            if name is not None:
                if name.type == "subscript":
                    name = name.child_by_field_name("name") or name
                out.add(src.slice(name))
        elif n.type == "for_statement":
            var = n.child_by_field_name("variable")
            if var is not None:
                out.add(src.slice(var))
        elif n.type == "expansion":
            kids = [c for c in n.children if c.type not in ("${", "}")]
            if len(kids) >= 2 and kids[1].type in (":=", "=") and kids[0].type == "variable_name":
                out.add(src.slice(kids[0]))
        stack.extend(n.children)
    return out


def read_script(text: str) -> Script:
    """Read ``text`` as bash would, running nothing: every simple command reached, words expanded.

    Raises ShellError (message, token, position) on a syntax error or a script too costly to read."""
    if "\x00" in text:
        at = text.index("\x00")
        raise ShellError("a NUL character cannot be part of a shell script", text[max(0, at - 20):at + 1], at)
    reader = _Reader(text)
    tree = _parser().parse(reader.src.data)
    root = tree.root_node
    if root.has_error:
        raise _syntax_error(reader.src, root)
    reader.assigned_anywhere = _assigned_names(root, reader.src, set())
    try:
        reader.run(root)
    except _Stop:
        pass
    except _LoopControl:
        pass
    except RecursionError:
        raise ShellError("the script nests too deeply to read", text[:40], 0) from None
    return reader.script

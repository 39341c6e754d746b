"""Word expansion: parameters, quotes, command words, field splitting and brace expansion."""

from __future__ import annotations

import itertools
import re

from worker.interop.shell.arithmetic import Arithmetic
from worker.interop.shell.patterns import remove_affix, replace
from worker.interop.shell.results import MAX_WORDS, Segment, Word
from worker.interop.shell.syntax import _first, _Source, parse
from worker.interop.shell.values import (
    _FIELD_BREAK,
    Kind,
    Piece,
    Value,
    _ansi_c,
    _known,
    _Positional,
    _requote,
    _requote_text,
    _scalar,
    _stored,
    _text,
    _unescape_double,
    _unescape_unquoted,
    _Unknown,
    _Var,
)


class Words(Arithmetic):
    """Expansion of words: what each node of a word stands for."""

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
            if not re.search(rb"\s", gap.replace(b"\\\n", b"")):
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
        gaps = [self.src.data[a.end_byte:b.start_byte] for a, b in itertools.pairwise(group)]
        if any(gaps) and all(not g.replace(b"\\\n", b"") for g in gaps):
            # 'a'\<newline>'b': the backslash-newline vanishes and the strings are one word
            pieces = [p for node in group for p in self.pieces(node, quoted=False)]
            return [f for variant in _brace_expand(pieces, self, group[0]) for f in _split_fields(variant, self.ifs())]
        text = self.src.data[group[0].start_byte:group[-1].end_byte].decode("utf-8", errors="surrogatepass")
        if any(c in text for c in "'\"\\`"):
            raise self.fail(group[0], f"cannot read the shell word {text[:80]}: quote it")
        synthetic = ": " + re.sub(r"\$([A-Za-z_][A-Za-z0-9_]*)", r"${\1}", text)
        tree = parse(synthetic.encode("utf-8", errors="surrogatepass"))
        command = _first(tree.root_node, "command")
        args = [c for i, c in enumerate(command.children) if command.field_name_for_child(i) == "argument"] \
            if command is not None else []
        whole = len(synthetic.encode("utf-8", errors="surrogatepass"))
        if tree.root_node.has_error or len(args) != 1 or args[0].end_byte != whole:
            raise self.fail(group[0], f"cannot read the shell word {text[:80]}: quote it")
        sub = type(self).__new__(type(self))
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
            if self.assume_defaults:  # the documented defaults: no command output
                return [Piece("", "quoted" if quoted else "split")]
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
            return None if self.assume_defaults else _Unknown("a script argument")
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
        if name in self.environment:  # given by the caller: the environment the script runs in
            return (Piece(self.environment[name], "quoted"),)
        return None if self.assume_defaults else _Unknown("environment")

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
        if not out and not (star and quoted):
            return [Piece("", "split")]  # "${A[@]}" of no element is no word at all, quoted or not
        return out or [Piece("", "quoted")]

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
        # and so does ${1:-default} of the script's own arguments (the script run with none, as the import reads it)
        from_env = (isinstance(value, _Unknown) and value.reason in ("environment", "a script argument")) or (
            value is None and name not in self.ever_set and name.isidentifier())
        current = None if value is None else value
        if op in (":-", "-", ":=", "=", ":+", "+", ":?", "?"):
            word = self.operand(operands, quoted)
            if isinstance(current, (_Unknown, _Positional)) and not from_env:
                return [Piece(text, "verbatim")]
            if from_env:
                if op in (":?", "?"):  # the script stops without it: it must come from the environment
                    return self._verbatim(text, _Unknown("environment"), name)
                if op in (":+", "+") and isinstance(value, _Unknown) and value.reason == "environment" \
                        and not self.assume_defaults:
                    # ${X:+-$X} of a variable the script never sets: kept whole, as $X itself is kept
                    return self._verbatim(text, value, name)
                self._add(self.script.defaults, "$" + name if name.isdigit() else name)
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
            return [Piece(remove_affix(s, pattern, op, self.charger(node)), kind)]
        if op in ("/", "//", "/#", "/%"):
            pattern_nodes = [c for c in rest[1:] if c.is_named]
            pat = self.operand(pattern_nodes[:1], False)
            rep = self.operand(pattern_nodes[1:2], True)
            if not _known(tuple(pat)) or not _known(tuple(rep)):
                return [Piece(text, "verbatim")]
            return [Piece(replace(s, pat, _text(tuple(rep)), op, self.charger(node)), kind)]
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


def _brace_expand(pieces: list[Piece], reader: Words, node) -> list[list[Piece]]:
    if not any(p.kind == "lit" and "{" in p.text for p in pieces):
        return [pieces]
    atoms = _atoms(pieces)
    out = _expand_atoms(atoms, reader, node)
    if len(out) > 1:
        text = reader.src.slice(node)
        reader.script.note(f"line {reader.line(node)}: bash brace expansion makes {len(out)} words of "
                           f"{text[:60]} (quote it to keep one word)")
    return out


def _expand_atoms(atoms: list[Piece], reader: Words, node) -> list[list[Piece]]:
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

"""Conditions: ``[ ]``, ``[[ ]]`` and ``test`` on known values, and the status a test has with the import's
documented defaults (the environment unset, no command output, no files)."""

from __future__ import annotations

from worker.interop.shell.arithmetic import _int_literal
from worker.interop.shell.patterns import glob_match, regex_search
from worker.interop.shell.values import _known, _NotKnown, _text
from worker.interop.shell.words import Words


class Conditions(Words):
    """Tests evaluated on what is known; ``_NotKnown`` (a test the import cannot decide) otherwise."""

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
            if self.assume_defaults:
                return False  # the documented defaults: no such file, no such variable
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
            if op == "=~" and extended:
                pattern = self.pieces(right, quoted=False)
                if not _known(tuple(pattern)):
                    raise _NotKnown
                return regex_search(a, pattern, self.charger(node))
            if op in ("=", "==", "!=") and extended:
                pattern = self.pieces(right, quoted=False)
                if not _known(tuple(pattern)):
                    raise _NotKnown
                return glob_match(a, pattern, self.charger(node)) == (op != "!=")
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

    def default_status(self, node) -> bool | None:
        """A test's status with the import's documented defaults for what it cannot know: a variable from the
        environment and the script's arguments unset, command output empty, a file test false."""
        if node.type not in ("test_command", "negated_command"):
            return None
        self.assume_defaults = True
        try:
            return self.last_status(node)
        finally:
            self.assume_defaults = False

    def default_case_body(self, subject, items) -> list | None:
        """The ``case`` arm bash takes with the documented defaults (``default_status``), or None."""
        self.assume_defaults = True
        try:
            value = self.expand_string(subject) if subject is not None else ()
            for item in items:
                patterns = [c for c in item.children if item.field_name_for_child(list(item.children).index(c)) == "value"]
                for pattern in patterns:
                    pat = self.expand_string(pattern)
                    if not _known(value) or not _known(pat):
                        return None
                    if glob_match(_text(value), pat, self.charger(item)):
                        return [c for c in item.named_children if c not in patterns]
            return None
        finally:
            self.assume_defaults = False


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
    raise _NotKnown

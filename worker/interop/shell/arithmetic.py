"""Arithmetic: ``$(( ))``, ``(( ))`` and array indices, 64-bit as bash computes them."""

from __future__ import annotations

import re

from worker.interop.shell.results import MAX_CALL_DEPTH
from worker.interop.shell.state import ReaderState
from worker.interop.shell.syntax import _first, _Source, parse
from worker.interop.shell.values import Piece, _known, _NotKnown, _Positional, _scalar, _text, _Unknown

_ASSIGNMENTS = frozenset({"=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "|=", "^=", "**="})


class Arithmetic(ReaderState):
    """Arithmetic on what is known; ``_NotKnown`` where an operand is not."""

    def arith_text(self, expr: str | None, node) -> int | None:
        """An arithmetic expression's value from its text (an array index, ``${X:1:2}``), or None."""
        if expr is None:
            return None
        expr = expr.strip()
        if re.fullmatch(r"-?\d+", expr):
            return int(expr)
        tree = parse(f": $(({expr}))".encode("utf-8", errors="surrogatepass"))
        found = _first(tree.root_node, "arithmetic_expansion")
        if found is None or tree.root_node.has_error:
            return None
        sub = type(self).__new__(type(self))
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
        if t in ("unary_expression", "postfix_expression") and any(c.type in ("++", "--") for c in node.children):
            target = node.named_children[0]
            op = next(c.type for c in node.children if c.type in ("++", "--"))
            old = self.arith(target)
            new = self.arith_assign(target, op[0] + "=", lambda: 1)
            return old if t == "postfix_expression" else new
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
            if op in _ASSIGNMENTS:
                return self.arith_assign(left, op, lambda: self.arith(right))
            a, b = self.arith(left), self.arith(right)
            return _binary(op, a, b)
        if t == "ternary_expression":
            cond, then, other = node.named_children[:3]
            return self.arith(then) if self.arith(cond) else self.arith(other)
        if t == "arithmetic_expansion":
            return self.arith(node.named_children[-1])
        raise _NotKnown

    def arith_assign(self, target, op: str, value) -> int:
        """``X = e``, ``X += e`` ... (and ``X++``): the variable takes the value, or becomes unknown with it."""
        if target.type != "variable_name":
            raise _NotKnown
        name = self.src.slice(target)
        try:
            result = value() if op == "=" else _binary(op[:-1], self.arith_var(name, target), value())
        except _NotKnown:
            self.set_var(name, _Unknown(f"an arithmetic assignment `{self.src.slice(target.parent)[:40]}`"))
            raise
        self.set_var(name, (Piece(str(result), "quoted"),))
        return result

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

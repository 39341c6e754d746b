"""tree-sitter-bash: the parser, byte offsets as character offsets, syntax errors, and small tree helpers."""

from __future__ import annotations

import re
from functools import lru_cache

from worker.interop.shell.results import ShellError

# --------------------------------------------------------------------------------------------
# Parsing



@lru_cache(maxsize=1)
def _parser():
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


_ASCII = bytes(range(128)) + b"." * 128
_DOLLAR_BEFORE_NON_ASCII = re.compile(rb"\$(?=[\x80-\xff])")


def parse(data: bytes):
    """The syntax tree of ``data`` (UTF-8), parsed from an all-ASCII copy with the same byte offsets.

    tree-sitter-bash's scanner can crash the process on some non-ASCII input; bash itself treats a
    non-ASCII character as an ordinary word character that no name holds (``$X。`` is ``$X`` then ``。``),
    which each of its bytes becomes: ``.``. A ``$`` before one is a literal ``$`` for bash (``$é``), and
    becomes ``.`` too (the grammar refuses ``$.``). Every node's text is read from the original bytes."""
    if data.isascii():
        return _parser().parse(data)
    return _parser().parse(_DOLLAR_BEFORE_NON_ASCII.sub(b".", data).translate(_ASCII))


_OPERAND = re.compile(rb"\$\{[A-Za-z_0-9]+(?::?[-=+?])")


def repaired(data: bytes) -> bytes | None:
    """``data`` rewritten, byte for byte, around what bash accepts and tree-sitter-bash does not; None when
    nothing was rewritten. The reader reads every node's text from the original, so the values are bash's:

    - in the operand of ``${X:-...}`` (``:=``, ``:+``, ``:?`` and the forms without ``:``), the body of an
      arithmetic expansion (``${X:-$(((a + b) * 2))}``) becomes ``x``s, and ``[``/``]`` become ``x``
      (``${C:-['npu','cpu']}``);
    - a backslash that ends the file (a continuation with nothing after it) becomes a space."""
    out = bytearray(data)
    for match in _OPERAND.finditer(data):
        depth, i = 1, match.end()
        while i < len(data) and depth:
            if data.startswith(b"${", i):
                depth, i = depth + 1, i + 2
                continue
            if data[i:i + 1] == b"}":
                depth -= 1
            elif data[i:i + 1] in (b"[", b"]"):
                out[i] = ord("x")
            elif data.startswith(b"$((", i):
                close = _arith_end(data, i + 3)
                if close > 0:
                    out[i + 3:close] = bytes(ord("x") if c != ord("\n") else c for c in data[i + 3:close])
                    i = close + 2
                    continue
            i += 1
    stripped = data.rstrip()
    if stripped.endswith(b"\\") and not stripped.endswith(b"\\\\"):
        out[len(stripped) - 1] = ord(" ")
    return bytes(out) if out != data else None


def _arith_end(data: bytes, i: int) -> int:
    """Where the ``))`` closing an arithmetic expansion whose body starts at ``i`` begins, or -1."""
    depth = 0
    while i < len(data):
        ch = data[i:i + 1]
        if ch == b"(":
            depth += 1
        elif ch == b")":
            if depth == 0:
                return i if data[i + 1:i + 2] == b")" else -1
            depth -= 1
        i += 1
    return -1


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


def _first(node, kind: str):
    if node.type == kind:
        return node
    for child in node.children:
        found = _first(child, kind)
        if found is not None:
            return found
    return None



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


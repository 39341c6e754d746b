"""The entry point: a script's text -> what bash would run, read without running anything."""

from __future__ import annotations

from collections.abc import Mapping

from worker.interop.shell.results import MAX_STEPS, Script, ShellError
from worker.interop.shell.statements import Statements, _LoopControl, _Stop
from worker.interop.shell.syntax import _assigned_names, _syntax_error, parse, repaired


class _Reader(Statements):
    """A reader with every concern: statements, words, arithmetic."""


def read_script(text: str, *, max_steps: int = MAX_STEPS, environment: Mapping[str, str] | None = None) -> Script:
    """Read ``text`` as bash would, running nothing: every simple command reached, words expanded.

    Raises ShellError (message, token, position) on a syntax error, ShellBudgetError (a ShellError) when
    reading it costs more than ``max_steps`` steps. ``environment`` holds variables the script reads from its
    environment whose values the caller knows (they are then not listed as unknown)."""
    if "\x00" in text:
        at = text.index("\x00")
        raise ShellError("a NUL character cannot be part of a shell script", text[max(0, at - 20):at + 1], at)
    reader = _Reader(text, max_steps, environment)
    root = parse(reader.src.data).root_node
    if root.has_error:
        rewritten = repaired(reader.src.data)
        second = parse(rewritten).root_node if rewritten is not None else None
        if second is None or second.has_error:
            raise _syntax_error(reader.src, root)
        root = second
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

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

Split by concern: ``results`` (what the reading yields and its limits), ``syntax`` (tree-sitter-bash),
``values`` (a value as pieces of known and unknown text), ``arithmetic`` (``$(( ))`` and ``(( ))``),
``patterns`` (globs and ``=~`` on linear-time matchers), ``words`` (expansion, quote removal, field
splitting, brace expansion), ``conditions`` (``[ ]``, ``[[ ]]``, ``test``), ``statements`` (the walk: lists,
branches, loops, functions, assignments) and ``reader`` (the entry point).
"""

from worker.interop.shell.reader import read_script
from worker.interop.shell.results import (
    MAX_STEPS,
    Command,
    Script,
    Segment,
    ShellBudgetError,
    ShellError,
    Word,
)

__all__ = ["MAX_STEPS", "Command", "Script", "Segment", "ShellBudgetError", "ShellError", "Word", "read_script"]


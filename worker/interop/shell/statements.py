"""Statements: the walk in the order bash executes (lists, branches, loops, functions, builtins, assignments, tests)."""

from __future__ import annotations

from worker.interop.shell.conditions import Conditions
from worker.interop.shell.patterns import glob_match
from worker.interop.shell.results import (
    MAX_CALL_DEPTH,
    MAX_LOOP_ITERATIONS,
    MAX_VALUE_CHARS,
    MAX_WORDS,
    Command,
    ShellError,
    Word,
)
from worker.interop.shell.values import Piece, Value, _known, _NotKnown, _stored, _text, _Unknown, _Var


class _Stop(Exception):
    """``exit`` (or ``return`` in a function) reached on a path that certainly runs."""

    def __init__(self, kind: str):
        self.kind = kind


class _LoopControl(Exception):
    def __init__(self, kind: str):
        self.kind = kind


_SIMPLE_IGNORED = frozenset({"comment", "heredoc_body", "heredoc_start", "heredoc_end", "file_redirect",
                             "heredoc_redirect", "herestring_redirect", "\n", ";", "&", "&&", "||", "|", "|&",
                             ";;", "fi", "then", "else", "do", "done", "esac", "in"})


class Statements(Conditions):
    """The walk: each statement executed as bash would, on what is known."""

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

    def _s_compound_statement(self, node) -> None:
        if not self.src.slice(node).startswith("(("):
            self.run_all(node.children)
            return
        # (( expr )): arithmetic whose status is its value's truth; its assignments last
        status: bool | None = True
        for expr in node.named_children:
            if expr.type == "comment":
                continue
            try:
                status = bool(self.arith(expr))
            except _NotKnown:
                status = None
            except ZeroDivisionError:
                raise self.fail(node, "division by zero in an arithmetic command") from None
        self.arith_status = (node.start_byte, status)

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
        self.list_status = (node.start_byte, status)

    def last_status(self, node) -> bool | None:
        """Whether a command succeeds, where that can be known: a test on known values, true/false, and any
        other command taken as succeeding (a script that runs verl expects its set-up to work)."""
        if node.type == "test_command":
            return self.test(node)
        if node.type == "compound_statement" and self.src.slice(node).startswith("(("):
            at, status = self.arith_status
            return status if at == node.start_byte else None
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
        if node.type == "list":  # `a && b || c`: what the walk of that list found
            at, status = self.list_status
            return status if at == node.start_byte else None
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
        seen: list[tuple[list | None, list, bool | None]] = []
        for cond, body in branches:
            if cond is None:
                status: bool | None = True
                why = "else"
            else:
                self.run_all(cond)
                status = self.last_status(cond[-1]) if cond else True
                why = " ".join(self.src.slice(c) for c in cond)[:80]
            seen.append((cond, body, status))
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
        chosen = None
        for cond, body, status in seen:
            if status is None:
                status = self.default_status(cond[-1]) if cond else None
            if status is None or status:
                chosen = body if status else None
                break
        label = f"`if {undecided[0][0]}`" if undecided else ""

        def walk() -> None:
            for why, body in undecided:
                self.with_condition(f"if {why}", lambda b=body: self.run_all(b))

        self.arrays_from_default_branch(node, chosen, label, walk)

    def _s_case_statement(self, node) -> None:
        subject = node.child_by_field_name("value")
        value = self.expand_string(subject) if subject is not None else ()
        items = [c for c in node.named_children if c.type == "case_item"]
        chosen = self.default_case_body(subject, items) if not _known(value) else None
        why = f"`case {self.src.slice(subject)[:40] if subject is not None else ''} in ...`"
        self.arrays_from_default_branch(node, chosen, why, lambda: self.case_items(node, subject, value, items))

    def case_items(self, node, subject, value, items) -> None:
        for item in items:
            patterns = [c for c in item.children if item.field_name_for_child(list(item.children).index(c)) == "value"]
            body = [c for c in item.named_children if c not in patterns]
            matched: bool | None = False
            for pattern in patterns:
                pat = self.expand_string(pattern)
                if not _known(value) or not _known(pat):
                    matched = None
                    break
                if glob_match(_text(value), pat, self.charger(node)):
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

    # ---- undecidable branches: arrays from the branch bash takes with the documented defaults (conditions.py)

    def arrays_from_default_branch(self, node, chosen: list | None, why: str, walk) -> None:
        """Walk undecidable branches (``walk``: what each assigns becomes unknown), then give each array that
        ``chosen`` (the branch bash takes with the documented defaults) changes the value it has there, and
        list that choice: arrays of arguments are the ones a verl command is built from."""
        if chosen is None:
            walk()
            return
        before, count = dict(self.vars), len(self.script.commands)
        self.condition.append(why)
        try:
            self.run_all(chosen)
        except (_Stop, _LoopControl):
            pass
        finally:
            self.condition.pop()
        taken, self.vars = self.vars, before
        del self.script.commands[count:]
        walk()
        for name, value in taken.items():
            if isinstance(value, list) and value is not before.get(name) and not isinstance(self.vars.get(name), list):
                self.vars[name] = value
                self.script.note(f"line {self.line(node)}: {why} cannot be decided here; the array {name} is read "
                                 "from the branch bash takes with the environment unset, no command output and no "
                                 "files (the import's defaults)")

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

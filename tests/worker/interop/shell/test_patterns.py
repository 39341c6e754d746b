"""Pattern matching on linear-time matchers: globs on our Thompson NFA, ``=~`` on RE2, bash as the oracle.

Each table row is read by ``read_script`` and run by bash (``printf``), and the two must print the same;
the property tests compare the NFA with Python's ``re`` on inputs short enough for backtracking to be
harmless; the pathological inputs of issue 18 must cost few steps and little time.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.interop.shell import MAX_STEPS, ShellBudgetError, read_script
from worker.interop.shell.patterns import glob_match, regex_search, remove_affix, replace
from worker.interop.shell.syntax import parse
from worker.interop.shell.values import Piece, _NotKnown
from worker.interop.verl import ImportBudgetError, VerlImportError, import_command

BASH = shutil.which("bash")
needs_bash = pytest.mark.skipif(BASH is None, reason="bash is the oracle")


def _bash(script: str) -> list[str]:
    """What bash prints for ``script``: one line per printf of the script's ``echo_`` calls."""
    assert BASH is not None
    proc = subprocess.run([BASH, "--norc", "--noprofile", "-c", script], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\0")[:-1]


EXPANSIONS = [
    ("a/b/c.tar.gz", "${X#*/}"), ("a/b/c.tar.gz", "${X##*/}"), ("a/b/c.tar.gz", "${X%.*}"), ("a/b/c.tar.gz", "${X%%.*}"),
    ("a/b/c.tar.gz", "${X/./_}"), ("a/b/c.tar.gz", "${X//./_}"), ("a/b/c.tar.gz", "${X/#a/A}"), ("a/b/c.tar.gz", "${X/%gz/xz}"),
    ("aXbXc", "${X//X/}"), ("Qwen2.5-7B", "${X//[.-]/_}"), ("Qwen2.5-7B", "${X//[![:alpha:]]/}"), ("abc", "${X//?/-}"),
    ("abcabc", "${X/b*/Z}"), ("abcabc", "${X//b?/Z}"), ("a*b", '${X//"*"/+}'), ("a*b", "${X//\\*/+}"),
    ("a-b_c", "${X//[a-b]/.}"), ("a-b_c", "${X//[_-]/.}"), ("2024-01-05", "${X//[[:digit:]]/9}"), ("", "${X//a/b}"),
    ("aaa", "${X//a*/b}"), ("aaa", "${X#a*}"), ("aaa", "${X##a*}"), ("aaa", "${X%a*}"), ("aaa", "${X%%a*}"),
    ("path/to/model/", "${X%/}"), ("héllo/wörld", "${X##*/}"), ("héllo", "${X//[é]/e}"),
]


@needs_bash
def test_parameter_patterns_as_bash() -> None:
    lines = "".join(f"X={_sq(value)}; printf '%s\\0' \"{expr}\"\n" for value, expr in EXPANSIONS)
    expected = _bash(lines)
    script = read_script(lines.replace("printf '%s\\0'", "echo_"))
    got = [c.words[1].text for c in script.commands]
    assert got == expected


def _sq(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


CASES = [
    ("abc", "a*"), ("abc", "*c"), ("abc", "?b?"), ("abc", "[ab]*"), ("abc", "[!a]*"), ("abc", "[^a]*"), ("a.b", "*.*"),
    ("ab", "a\\*"), ("a*", "a\\*"), ("a*", '"a*"'), ("ab", '"a*"'), ("x", "[[:alpha:]]"), ("5", "[[:alpha:]]"),
    ("-", "[a-]"), ("b", "[a-c]"), ("fsdp2", "fsdp|fsdp2"), ("npu", "cuda|gpu"), ("", "*"), ("", "?"),
    ("a" * 60, "*a*a*a*a*a*a*ab"), ("[x", "[x"), ("é", "?"), ("éa", "?a"),
]


@needs_bash
def test_case_patterns_as_bash() -> None:
    lines = "".join(f"case {_sq(value)} in {pattern}) printf '%s\\0' yes;; *) printf '%s\\0' no;; esac\n"
                    for value, pattern in CASES)
    expected = _bash(lines)
    script = read_script(lines.replace("printf '%s\\0'", "echo_"))
    assert [c.words[1].text for c in script.commands] == expected


REGEXES = [
    ("aaaa", "^a+$"), ("aab", "^a+$"), ("v0.9.1", "^v[0-9]+\\.[0-9]+"), ("v0x9", "^v[0-9]+\\.[0-9]+"), ("abab", "^(ab){2}$"),
    ("ab", "^(a|b)+$"), ("a.b", '"a.b"'), ("axb", '"a.b"'), ("axb", "a.b"), ("Qwen2", "[[:digit:]]$"), ("x\\y", "[\\\\]"),
    ("a_1", "^\\w+$"), ("a 1", "\\s"), ("fsdp2", "^fsdp2?$"), ("FSDP", "^fsdp$"), ("", "^$"),
    ("a" * 28 + "!", "^(a+)+$"), ("a" * 28, "^(a+)+$"), ("xx", "x{2,3}"), ("ab", "a|"),
]


@needs_bash
def test_regex_tests_as_bash() -> None:
    lines = "".join(f"if [[ {_sq(value)} =~ {regex} ]]; then printf '%s\\0' yes; else printf '%s\\0' no; fi\n"
                    for value, regex in REGEXES)
    expected = _bash(lines)
    script = read_script(lines.replace("printf '%s\\0'", "echo_"))
    got = [c.words[1].text for c in script.commands if not c.condition]
    assert got == expected


def test_what_re2_cannot_run_is_undecided() -> None:
    """A back-reference (from a variable: written in the test, ``\\1`` is a quoted ``1`` for bash) has no
    linear-time matcher: the branch is one the import cannot decide."""
    script = read_script("X=aa\nR='(a)\\1'\nif [[ $X =~ $R ]]; then Y=1; fi\necho $Y\n")
    assert script.commands[0].words[1].verbatim
    with pytest.raises(_NotKnown):
        regex_search("aa", [Piece("(a)\\1", "lit")], lambda n: None)


# --------------------------------------------------------------------------------------------
# The NFA against Python's re on short inputs (where backtracking costs nothing)


def _reference(glob: str) -> str:
    out = []
    for ch in glob:
        out.append(".*" if ch == "*" else "." if ch == "?" else re.escape(ch))
    return "".join(out)


GLOBS = st.text(alphabet="ab*?", max_size=8)
TEXTS = st.text(alphabet="abc", max_size=10)
FREE = lambda n: None  # noqa: E731 - a charge that counts nothing, for the pure functions


@settings(max_examples=400, deadline=None)
@given(TEXTS, GLOBS)
def test_glob_match_is_fullmatch(s: str, glob: str) -> None:
    assert glob_match(s, [Piece(glob, "split")], FREE) == bool(re.fullmatch(_reference(glob), s, re.S))


@settings(max_examples=400, deadline=None)
@given(TEXTS, GLOBS, st.sampled_from(["#", "##", "%", "%%"]))
def test_remove_affix_is_the_shortest_or_longest_cut(s: str, glob: str, op: str) -> None:
    rx = re.compile(_reference(glob), re.S)
    if op.startswith("#"):
        cuts = [k for k in range(len(s) + 1) if rx.fullmatch(s[:k])]
        want = s[(max(cuts) if op == "##" else min(cuts)):] if cuts else s
    else:
        cuts = [k for k in range(len(s) + 1) if rx.fullmatch(s[k:])]
        want = s[:(min(cuts) if op == "%%" else max(cuts))] if cuts else s
    assert remove_affix(s, [Piece(glob, "split")], op, FREE) == want


@settings(max_examples=400, deadline=None)
@given(TEXTS, GLOBS.filter(bool), st.sampled_from(["/", "//"]))
def test_replace_takes_the_longest_match_at_the_leftmost_start(s: str, glob: str, op: str) -> None:
    rx = re.compile(_reference(glob), re.S)
    out, i, done = [], 0, False
    while i < len(s):
        ends = [k for k in range(len(s), i, -1) if not done and rx.fullmatch(s[i:k])]
        if ends:
            out.append("<>")
            i = ends[0]
            done = op == "/"
            continue
        out.append(s[i])
        i += 1
    assert replace(s, [Piece(glob, "split")], "<>", op, FREE) == "".join(out)


# --------------------------------------------------------------------------------------------
# Issue 18's pathological inputs: a few thousand steps, milliseconds


PATHOLOGICAL = {
    "regex": "X=" + "a" * 40 + "!\nif [[ $X =~ ^(a+)+$ ]]; then Y=1; fi\n",
    "case": "X=" + "a" * 60 + "\ncase $X in *a*a*a*a*a*a*ab) Y=1;; esac\n",
    "replace": "X=" + "a" * 4096 + "\nY=${X//*b/c}\n",
    "replace_hit": "X=" + "ab" * 2048 + "\nY=${X//*b/c}\nZ=${X//a*b/c}\nW=${X%%b*}\nV=${X#*a*a*a*a*a*a*b}\n",
}


@pytest.mark.parametrize("name", sorted(PATHOLOGICAL))
def test_pathological_patterns_are_cheap(name: str) -> None:
    text = PATHOLOGICAL[name] + "python3 -m verl.trainer.main_ppo trainer.nnodes=1\n"
    started = time.perf_counter()
    import_command(text, max_steps=100_000)
    assert time.perf_counter() - started < 1.0


def test_the_step_budget_is_a_parameter_and_named_when_spent() -> None:
    text = "X=" + "ab" * 2048 + "\nY=${X//a*b/c}\npython3 -m verl.trainer.main_ppo trainer.nnodes=1\n"
    import_command(text)
    with pytest.raises(ImportBudgetError) as caught:
        import_command(text, max_steps=2_000)
    assert caught.value.budget == 2_000 and "2000 steps" in caught.value.message
    assert isinstance(caught.value, VerlImportError) and text[caught.value.position:].startswith("${X//a*b/c}")
    with pytest.raises(ShellBudgetError):
        read_script("for i in $(seq 1); do :; done\n" + "X=1\n" * 300, max_steps=100)
    assert MAX_STEPS >= 100_000


# --------------------------------------------------------------------------------------------
# Non-ASCII text: tree-sitter reads an all-ASCII copy with the same byte offsets


def _spans(node, out: list) -> list:
    out.append((node.type, node.start_byte, node.end_byte))
    for child in node.children:
        _spans(child, out)
    return out


NON_ASCII = [
    'X="héllo wörld"\necho "$X" ${X}ü $é\n',
    "# ein Kommentar über Ü\nMODEL=模型/路径\necho ${MODEL##*/} '日本' $'\\u00e9'\n",
    "A=(ä ö ü)\nfor x in \"${A[@]}\"; do echo \"$x\"; done\ncase é in é) echo yes;; esac\n",
]


@pytest.mark.parametrize("text", NON_ASCII)
def test_non_ascii_parses_as_its_ascii_copy(text: str) -> None:
    data = text.encode()
    ascii_copy = re.sub(rb"\$(?=[\x80-\xff])", b".", data).translate(bytes(range(128)) + b"." * 128)
    assert len(ascii_copy) == len(data) and ascii_copy.isascii()
    assert _spans(parse(data).root_node, []) == _spans(parse(ascii_copy).root_node, [])
    assert not parse(data).root_node.has_error


@needs_bash
@pytest.mark.parametrize("text", NON_ASCII)
def test_non_ascii_words_as_bash(text: str) -> None:
    expected = _bash(text.replace("echo ", "printf '%s\\0' "))
    words = [w.text for c in read_script(text).commands for w in c.words[1:]]
    assert words == expected

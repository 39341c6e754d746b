"""Shell syntax bash accepts that verl's scripts use (issue 19): each snippet read by ``read_script`` prints
what bash prints for it, bash being the oracle."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from worker.interop.shell import read_script

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash is the oracle")

SNIPPETS = {
    "empty array quoted": 'EXTRA=()\necho_ a "${EXTRA[@]}" b\n',
    "empty array unquoted": "EXTRA=()\necho_ a ${EXTRA[@]} b\n",
    "empty array star": 'EXTRA=()\necho_ a "${EXTRA[*]}" b\n',
    "array of one empty": 'EXTRA=("")\necho_ a "${EXTRA[@]}" b\n',
    "function without arguments": 'f() { echo_ x "$@" y; }\nf\n',
    "positional default": "ENGINE=${1:-vllm}\nN=${2-4}\necho_ $ENGINE $N\n",
    "arithmetic command": "NGPU=8; PP=2\nif (( NGPU % PP != 0 )); then echo_ odd; else echo_ even; fi\n",
    "arithmetic assignment": "X=3\n(( X += 2 ))\n(( Y = X * 2 ))\n(( X++ ))\necho_ $X $Y\n",
    "arithmetic status false": "A=0\n(( A )) && echo_ yes || echo_ no\n",
    "nested arithmetic default": "a=1; b=2\nX=${X:-$(((a + b) * 2))}\necho_ $X\n",
    "list default": "C=${C:-['npu','cpu']}\necho_ $C\n",
    "quoted strings continued": "echo_ 'a,'\\\n'b' \"c\"\\\n'd'\n",
    "trailing backslash": "echo_ a b \\\n",
}


def _bash(script: str) -> list[str]:
    assert BASH is not None
    proc = subprocess.run([BASH, "--norc", "--noprofile", "-c", "echo_() { printf '%s\\0' \"$@\"; printf '|\\0'; }\n" + script],
                          capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    return proc.stdout.split("\0")[:-1]


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_read_as_bash_reads_it(name: str) -> None:
    text = SNIPPETS[name]
    words: list[str] = []
    for command in read_script(text).commands:
        if command.name == "echo_" and not command.condition:
            words.extend([w.text for w in command.words[1:]] + ["|"])
    assert words == _bash(text)

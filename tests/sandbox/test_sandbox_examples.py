"""Seed 000's examples through the real runner: species (json-stdin, cwd = the
workdir, a mount) and word_count (args mode)."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import Sandbox

# Seed 000's scripts, word for word, as the examples ship them.
_TOOLS = Path(__file__).resolve().parents[2] / "examples" / "field-guide" / "tools"
SPECIES_PY = (_TOOLS / "species.py").read_text()
WORD_COUNT_PY = (_TOOLS / "word_count.py").read_text()


PAGES = {
    "brown-trout.md": ("Brown trout", "Salmonidae", "[rivers, lakes]", 60),
    "pike.md": ("Northern pike", "Esocidae", "[lakes]", 100),
    "grayling.md": ("Grayling", "Salmonidae", "[rivers]", 45),
}


def write_pages(sandbox: Sandbox) -> None:
    species = sandbox.data / "species"
    species.mkdir()
    for page, (name, family, habitat, length) in PAGES.items():
        (species / page).write_text(
            f"---\nname: {name}\nfamily: {family}\nhabitat: {habitat}\nlength_cm: {length}\n"
            f"---\n\nAbout the {name}.\n"
        )


def test_species_json_stdin_runs_in_the_workdir(sandbox: Sandbox) -> None:
    write_pages(sandbox)
    result = sandbox.call(SPECIES_PY, {"habitat": "rivers"}, name="species")
    assert result.outcome == "ok", result.output
    assert not result.is_error
    assert result.exit_code == 0
    assert json.loads(result.output) == [
        {
            "page": "brown-trout.md",
            "name": "Brown trout",
            "family": "Salmonidae",
            "habitat": ["rivers", "lakes"],
            "length_cm": 60,
        },
        {
            "page": "grayling.md",
            "name": "Grayling",
            "family": "Salmonidae",
            "habitat": ["rivers"],
            "length_cm": 45,
        },
    ]


def test_species_without_filter_lists_all(sandbox: Sandbox) -> None:
    write_pages(sandbox)
    result = sandbox.call(SPECIES_PY, {}, name="species")
    assert [row["page"] for row in json.loads(result.output)] == sorted(PAGES)


def test_word_count_args_mode(sandbox: Sandbox) -> None:
    (sandbox.data / "notes").mkdir()
    (sandbox.data / "notes" / "a.md").write_text("one two three\nfour five\n")
    result = sandbox.call(
        WORD_COUNT_PY,
        {"path": "notes/a.md"},
        name="word_count",
        input="args",
        parameters={
            "type": "object",
            "required": ["path"],
            "properties": {"path": {"type": "string"}},
        },
    )
    assert result.outcome == "ok", result.output
    assert result.output == "5\n"


def test_args_mode_values_use_str_and_stdin_is_empty(sandbox: Sandbox) -> None:
    script = "import sys; print(sys.argv[1:]); print(repr(sys.stdin.read()))"
    result = sandbox.call(script, {"flag": True, "items": [1, "a"], "n": 3}, input="args")
    assert result.output == "['--flag=True', \"--items=[1, 'a']\", '--n=3']\n''\n"


def test_json_stdin_is_one_object_then_closed(sandbox: Sandbox) -> None:
    script = "import json, sys; print(json.loads(sys.stdin.read()))"
    result = sandbox.call(script, {"a": [1, 2], "b": "é"})
    assert result.output == "{'a': [1, 2], 'b': 'é'}\n"


def test_stdout_and_stderr_are_combined_in_order(sandbox: Sandbox) -> None:
    script = (
        "import sys\n"
        "for i in range(3):\n"
        "    sys.stdout.write(f'out{i}\\n'); sys.stdout.flush()\n"
        "    sys.stderr.write(f'err{i}\\n'); sys.stderr.flush()\n"
    )
    result = sandbox.call(script)
    assert result.output == "out0\nerr0\nout1\nerr1\nout2\nerr2\n"


def test_environment_is_exactly_the_five_variables(sandbox: Sandbox) -> None:
    result = sandbox.call("import os, json; print(json.dumps(dict(os.environ)))")
    assert json.loads(result.output) == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/tmp/vessel",
        "TMPDIR": "/tmp/vessel",
        "VESSEL_OUTBOX": "/tmp/vessel/outbox",
    }


def test_workdir_not_under_a_mount_is_an_empty_folder(sandbox: Sandbox) -> None:
    result = sandbox.call("import os; print(os.getcwd(), os.listdir('.'))", workdir="/work/here")
    assert result.output == "/work/here []\n"


def test_workspace_is_writable_and_kept_within_a_turn(sandbox: Sandbox) -> None:
    write = "import pathlib; pathlib.Path('/tmp/vessel/note.txt').write_text('kept')"
    read = "import pathlib, os; print(pathlib.Path(os.environ['HOME'], 'note.txt').read_text())"
    assert sandbox.call(write, turn="t1").outcome == "ok"
    assert sandbox.call(read, turn="t1").output == "kept\n"
    assert "FileNotFoundError" in sandbox.call(read, turn="t2").output


def test_outbox_files_come_back(sandbox: Sandbox) -> None:
    script = (
        "import os, pathlib\n"
        "box = pathlib.Path(os.environ['VESSEL_OUTBOX'])\n"
        "(box / 'sub').mkdir()\n"
        "(box / 'report.txt').write_text('hello')\n"
        "(box / 'sub' / 'data.bin').write_bytes(bytes(range(256)))\n"
    )
    result = sandbox.call(script)
    names = {f.name: f for f in result.files}
    assert set(names) == {"report.txt", "sub/data.bin"}
    assert names["report.txt"].size == 5
    assert names["report.txt"].content_base64 == "aGVsbG8="
    assert names["sub/data.bin"].size == 256
    assert result.skipped_files == ()

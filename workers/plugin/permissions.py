"""The permissions a plugin derives from its sources, read statically (seed 002, issue 16).

Every member chain on `host` gives `host:` and the chain joined by `:`:
`host.workspace.write(...)` and `host.workspace!.write(...)` give
`host:workspace:write`, `host.fetch` gives `host:fetch`, `host.session.llm`
gives `host:session:llm`. `host?.a`, `host.a?.b`, `host["a"]` and
`globalThis.host.a` count too. Any `host.plugins` method that builds or
releases (a member whose name holds "build" or "release") also gives
`agentApi:plugins.write`. A handler's `console.log/info/warn/error/debug` goes
to `host.log` at the matching level (`log` is `info`), so each gives that
`host:log:<level>`.

The scan blanks comments and the text of string literals first (template
literals keep their `${...}` code), so a chain in a comment or a string
derives nothing. It is conservative where JavaScript's grammar needs a parser
(a regular expression literal holding a quote may hide code from the scan);
at run time a host call outside the list is refused anyway, so a name built
at run time can never widen the rights (workers/plugin/runner.py passes the
chain as called).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["PLUGINS_WRITE", "blank_comments_and_strings", "derive_permissions"]

PLUGINS_WRITE = "agentApi:plugins.write"

# `host` as its own identifier (not `.host`, `myhost`, `host_`), optionally as
# `globalThis.host`, followed by one member step at least.
_HOST = re.compile(r"(?<![\w$.])(?:globalThis\s*\.\s*)?host(?![\w$])")
_STEP = re.compile(
    r"\s*!?\s*(?:\?\.|\.)\s*([A-Za-z_$][\w$]*)"  # .name  ?.name  !.name
    r"|\s*!?\s*(?:\?\.)?\s*\[\s*(['\"])([A-Za-z_$][\w$]*)\2\s*\]"  # ["name"] ?.["name"]
)
_BUILDS = re.compile(r"build|release", re.IGNORECASE)
# `console.<method>` (or `globalThis.console.<method>`): the context sends it to host.log.
_CONSOLE = re.compile(
    r"(?<![\w$.])(?:globalThis\s*\.\s*)?console\s*(?:\?\.|\.)\s*(log|info|warn|error|debug)(?![\w$])"
)
_CONSOLE_LEVELS = {
    "log": "info",
    "info": "info",
    "warn": "warn",
    "error": "error",
    "debug": "debug",
}


def blank_comments_and_strings(code: str) -> str:
    """`code` with comments and string text replaced by spaces (lengths and lines kept).

    Quotes stay, so `host["fetch"]` still reads as one member step: the text of
    a string right inside `[ ]` after a chain is kept.
    """
    out = list(code)
    i, n = 0, len(code)
    braces: list[int] = []  # depth of `{` at each open `${` of a template literal

    def blank(start: int, end: int) -> None:
        for k in range(start, end):
            if out[k] != "\n":
                out[k] = " "

    depth = 0
    while i < n:
        c = code[i]
        nxt = code[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            end = code.find("\n", i)
            end = n if end < 0 else end
            blank(i, end)
            i = end
        elif c == "/" and nxt == "*":
            end = code.find("*/", i + 2)
            end = n if end < 0 else end + 2
            blank(i, end)
            i = end
        elif c in "'\"":
            j = i + 1
            while j < n and code[j] != c and code[j] != "\n":
                j += 2 if code[j] == "\\" else 1
            # Keep a member name in brackets: host["fetch"].
            inner = code[i + 1 : j]
            before = code[:i].rstrip()
            if not (before.endswith("[") and re.fullmatch(r"[A-Za-z_$][\w$]*", inner)):
                blank(i + 1, min(j, n))
            i = j + 1
        elif c == "`" or (c == "}" and braces and braces[-1] == depth):
            if c == "}":
                braces.pop()
            j = i + 1
            while j < n and code[j] != "`":
                if code[j] == "\\":
                    j += 2
                    continue
                if code[j] == "$" and j + 1 < n and code[j + 1] == "{":
                    break
                j += 1
            blank(i + 1, min(j, n))
            if j < n and code[j] == "$":
                braces.append(depth)
                i = j + 2
            else:
                i = j + 1
        else:
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            i += 1
    return "".join(out)


def _chains(code: str) -> Iterable[list[str]]:
    for found in _HOST.finditer(code):
        at = found.end()
        chain: list[str] = []
        while (step := _STEP.match(code, at)) is not None:
            chain.append(step.group(1) or step.group(3))
            at = step.end()
        if chain:
            yield chain


def derive_permissions(sources: Iterable[str]) -> tuple[str, ...]:
    """The sorted permissions the source texts derive."""
    found: set[str] = set()
    for source in sources:
        code = blank_comments_and_strings(source)
        for method in _CONSOLE.finditer(code):
            found.add(f"host:log:{_CONSOLE_LEVELS[method.group(1)]}")
        for chain in _chains(code):
            found.add("host:" + ":".join(chain))
            if chain[0] == "plugins" and any(_BUILDS.search(m) for m in chain[1:]):
                found.add(PLUGINS_WRITE)
    return tuple(sorted(found))

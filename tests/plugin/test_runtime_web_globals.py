# ruff: noqa: E501 (tables of JavaScript expressions, each one line of code)
"""The web globals of a handler's context (URL, URLSearchParams, TextEncoder,
TextDecoder, atob, btoa, structuredClone): each behaves as Node's own does for a
table of inputs (the same expressions run in plain `node`, outside any sandbox,
are the oracle), none leads to the runtime's realm, and a patch in one call is
not seen by the next."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from workers.plugin.runner import PluginRunner
from workers.plugin.stage import node_binary

from .runtime_support import Bridge, Calls, published

# Evaluates each expression (indirect eval, in the global scope) and shows its
# value as JSON; the same text runs inside the context and in plain node.
SHOW = r"""
function norm(v) {
  if (v === undefined) return { undefined: true };
  if (typeof v === "number" && !Number.isFinite(v)) return { number: String(v) };
  if (typeof v === "bigint") return { bigint: String(v) };
  if (ArrayBuffer.isView(v)) return { view: Object.prototype.toString.call(v), bytes: Array.from(new Uint8Array(v.buffer, v.byteOffset, v.byteLength)) };
  if (Array.isArray(v)) return v.map(norm);
  if (v !== null && typeof v === "object") {
    const out = {};
    for (const k of Object.keys(v)) out[k] = norm(v[k]);
    return out;
  }
  return v;
}
function show(expr) {
  try {
    return { ok: norm((0, eval)(expr)) };
  } catch (e) {
    return { threw: e && e.name, isError: e instanceof Error };
  }
}
"""

SOURCE = (
    SHOW
    + """
tools.console = {
  description: "Writes to the console without awaiting anything.",
  handler: () => {
    console.log("a", 1, { b: [2] }, undefined);
    console.info("info");
    console.warn(new Error("careful"));
    console.error("bad", 10n);
    console.table([1]);
    console.trace("nowhere");
    return "done";
  },
};
// At a source's top level, outside any call: nowhere, and no error.
console.log("loading");
tools.evaluate = {
  description: "Evaluates expressions.",
  // As ASCII JSON text: the result's length is then the same counted in UTF-16
  // units (JavaScript) and in code points (the runner's cut).
  handler: (input) => JSON.stringify(input.exprs.map(show)).replace(/[\u007f-\uffff]/g, (c) => "\\\\u" + c.charCodeAt(0).toString(16).padStart(4, "0")),
};
"""
)

U = "new URL"
CASES = [
    f'{U}("HTTP://Ex%41mple.COM:80/a/./b/../c d?q=1 2#f g").href',
    f'{U}("../x?y#z", "https://a.b/c/d/e").href',
    f'{U}("?only", "https://a.b/c/d?old#h").href',
    f'{U}("#frag", "https://a.b/c/d?old#h").href',
    f'{U}("//h:8080/p", "http://a/b").href',
    f'{U}("/abs/../x/%2e/y", "http://a/b/c").href',
    f'{U}("http:\\\\\\\\back\\\\slash\\\\x").href',
    f'{U}("  \\t http://a/b\\nc  ").href',
    f'{U}("mailto:Me@x.com?subject=hi there").href',
    f'{U}("foo://Host/a b?c d#e f").href',
    f'{U}("data:text/plain,a b").pathname',
    f'{U}("file:///etc/../x").href',
    f'{U}("http://[::1]:3000/").host',
    f'{U}("http://[2001:db8:0:0:0:0:0:1]/").hostname',
    f'{U}("http://[::ffff:192.168.0.1]/").hostname',
    f'{U}("http://0x7f.1/").hostname',
    f'{U}("http://3232235521/").hostname',
    f'{U}("https://a:443/").port',
    f'{U}("https://a:444/").port',
    f'{U}("http://u:p%20q@a.com/").username + "|" + {U}("http://u:p q@a.com/").password',
    f'{U}("http://u:p@a.com:81/").origin',
    f'{U}("foo://a/").origin',
    f'{U}("http://a/\\"<>`{{}}|^\'").href',
    f'{U}("http://a/?\\"<>`{{}}|^\'").search',
    f'{U}("foo://a/?\'").search',
    f'{U}("http://a/#\\"<>` x").hash',
    f'{U}("http://a/é?é#é").href',
    f'{U}("http://a/?").search + "|" + {U}("http://a/#").hash',
    'JSON.stringify({u: new URL("http://a/b")})',
    'String(new URL("http://a/b"))',
    'URL.canParse("nope") + "|" + URL.canParse("x", "http://a/") + "|" + URL.canParse("http://a b/")',
    'new URL("nope")',
    'new URL("http://")',
    'new URL("http://a:99999/")',
    'new URL("http://a b/")',
    'new URL("x", "mailto:a")',
    'new URL("http://a/"+String.fromCharCode(0xd800)).href',
    # setters
    '(() => { const u = new URL("http://a/p?x=1#h"); u.pathname = "/q r"; u.search = "y=2 3";'
    ' u.hash = "k"; u.port = "8080"; u.hostname = "B.com"; return u.href; })()',
    '(() => { const u = new URL("http://a/"); u.host = "c.d:99"; u.username = "me@"; u.password = "p:w"; return u.href; })()',
    '(() => { const u = new URL("http://a:80/"); u.protocol = "https"; return u.href; })()',
    '(() => { const u = new URL("http://a/"); u.protocol = "foo"; u.port = "x"; return u.href; })()',
    '(() => { const u = new URL("http://a/"); u.href = "https://b/c"; return u.host + u.pathname; })()',
    '(() => { const u = new URL("http://a/"); u.href = "nope"; })()',
    '(() => { const u = new URL("http://a/"); u.search = ""; u.hash = ""; return u.href; })()',
    # searchParams, live-linked both ways
    '(() => { const u = new URL("http://a/?a=1&b=2"); u.searchParams.append("c", "3 4");'
    ' u.searchParams.delete("a"); return u.href; })()',
    '(() => { const u = new URL("http://a/?a=1"); const p = u.searchParams; u.search = "?z=9"; return p.get("z") + p.has("a"); })()',
    '(() => { const u = new URL("http://a/?a=1"); u.searchParams.delete("a"); return u.href; })()',
    'new URLSearchParams("?a=1&b=2&a=3").getAll("a")',
    'new URLSearchParams("a=1+2&b=%C3%A9%zz&=x&y").toString()',
    'Array.from(new URLSearchParams("a=%F0%9F%98%80&b=%FF&c"))',
    'new URLSearchParams({a: "1 2", b: "é&=+", c: "!\'()~*-._"}).toString()',
    'new URLSearchParams([["a", 1], ["b", null]]).toString()',
    'new URLSearchParams([["a"]])',
    'new URLSearchParams(new Map([["k", "v"]])).toString()',
    '(() => { const p = new URLSearchParams("b=2&a=1&c=3&a=0"); p.sort(); p.set("c", "x");'
    ' return [p.toString(), p.size, [...p.keys()], [...p.values()], p.has("a", "0"), p.get("zz")]; })()',
    '(() => { const p = new URLSearchParams("a=1&b=2&a=3"); p.set("a", "9"); p.delete("b", "7"); return p.toString(); })()',
    '(() => { const out = []; new URLSearchParams("x=1&y=2").forEach((v, k) => out.push(k + v)); return out; })()',
    'Object.prototype.toString.call(new URLSearchParams()) + Object.prototype.toString.call(new URL("http://a"))',
    # TextEncoder / TextDecoder
    'new TextEncoder().encode("a\\u20ac\\ud83d\\ude00\\ud800")',
    "new TextEncoder().encode()",
    "new TextEncoder().encoding",
    '(() => { const d = new Uint8Array(5); const r = new TextEncoder().encodeInto("a\\u20ac\\ud83d\\ude00", d); return [r, d]; })()',
    "new TextDecoder().decode(new Uint8Array([0xef, 0xbb, 0xbf, 0xe2, 0x82, 0xac, 0xff, 0xc3]))",
    'new TextDecoder("utf8", {ignoreBOM: true}).decode(new Uint8Array([0xef, 0xbb, 0xbf, 0x41]))',
    "new TextDecoder().decode(new Uint8Array([0xf0, 0x9f, 0x98, 0x80, 0xed, 0xa0, 0x80, 0xf4, 0x90, 0x80, 0x80, 0xe0, 0x80]).buffer)",
    'new TextDecoder("utf-8", {fatal: true}).decode(new Uint8Array([0x41, 0xc3]))',
    "(() => { const d = new TextDecoder(); return d.decode(new Uint8Array([0xe2, 0x82]), {stream: true})"
    ' + "|" + d.decode(new Uint8Array([0xac, 0x41])); })()',
    '[new TextDecoder().encoding, new TextDecoder("utf-8", {fatal: true}).fatal, new TextDecoder().ignoreBOM]',
    "new TextDecoder().decode(new DataView(new Uint8Array([0x68, 0x69]).buffer))",
    # atob / btoa
    'btoa("hello\\xff")',
    'btoa("")',
    'btoa("\\u0100")',
    'atob(" aGVs\\nbG8= ")',
    'atob("aGVsbG8")',
    'atob("a")',
    'atob("aGVsbG8!")',
    'atob("/+8=")',
    # structuredClone
    'structuredClone({a: [1, {b: "c"}], d: null, e: true})',
    "(() => { const a = {n: 1}; a.self = a; const c = structuredClone(a); return [c !== a, c.self === c]; })()",
    "(() => { const m = new Map([[1, {a: [1, 2]}]]); const c = structuredClone(m); return [c instanceof Map, c.get(1), c.get(1) !== m.get(1)]; })()",
    '[...structuredClone(new Set([1, "a", 2]))]',
    "structuredClone(new Date(86400000)).toISOString()",
    "(() => { const r = structuredClone(/a+b/gi); return [r.source, r.flags, r instanceof RegExp]; })()",
    "(() => { const b = new Uint16Array([1, 2, 3]); const c = structuredClone(b); b[0] = 9; return c; })()",
    "(() => { const buf = new ArrayBuffer(8); const x = new Uint8Array(buf, 2, 3); const c = structuredClone({x, y: new Uint8Array(buf)});"
    " return [c.x.byteOffset, c.x.length, c.x.buffer === c.y.buffer, c.y.buffer.byteLength]; })()",
    "structuredClone(new DataView(new Uint8Array([5, 6]).buffer))",
    '(() => { const e = structuredClone(new RangeError("bad")); return [e instanceof RangeError, e.message, e.name]; })()',
    'structuredClone([1, , 3]).length + "|" + (1 in structuredClone([1, , 3]))',
    "(() => { class P { constructor() { this.x = 1; } } const c = structuredClone(new P()); return [c.x, Object.getPrototypeOf(c) === Object.prototype]; })()",
    "structuredClone(10n) === 10n",
    "structuredClone(() => 1)",
    "structuredClone({f() {}})",
    'structuredClone(Symbol("s"))',
    "structuredClone(new WeakMap())",
    "structuredClone(Promise.resolve())",
    "structuredClone()",
]

# Each global, its instances, their methods and the errors they throw: their
# constructor's constructor must be the context's Function (its globalThis is
# the handler's, with no `process.versions`), never the runtime's.
REALM = (
    "((x) => {{ const F = x.constructor.constructor;"
    " return [F('return globalThis')() === globalThis, F('return typeof process.versions')()]; }})({})"
)
REACHABLE = {
    "URL": "URL",
    "a URL": 'new URL("http://a/?b=c")',
    "URL.prototype.toString": "URL.prototype.toString",
    "a URL's href getter": 'Object.getOwnPropertyDescriptor(URL.prototype, "href").get',
    "a URL's searchParams": 'new URL("http://a/?b=c").searchParams',
    "a search params iterator's next": 'new URLSearchParams("a=1").entries().next',
    "URL.canParse": "URL.canParse",
    "URLSearchParams": "URLSearchParams",
    "TextEncoder": "TextEncoder",
    "encoded bytes": 'new TextEncoder().encode("a")',
    "encodeInto's answer": 'new TextEncoder().encodeInto("a", new Uint8Array(2))',
    "TextDecoder": "TextDecoder",
    "TextDecoder.prototype.decode": "TextDecoder.prototype.decode",
    "atob": "atob",
    "btoa": "btoa",
    "structuredClone": "structuredClone",
    "a clone": "structuredClone(new Map())",
    "URL's error": '(() => { try { new URL("nope"); } catch (e) { return e; } })()',
    "atob's error": '(() => { try { atob("!"); } catch (e) { return e; } })()',
    "btoa's error": '(() => { try { btoa("\\u0100"); } catch (e) { return e; } })()',
    "TextDecoder's error": '(() => { try { new TextDecoder("x"); } catch (e) { return e; } })()',
    "a fatal decode's error": '(() => { try { new TextDecoder("utf-8", {fatal: true}).decode(new Uint8Array([255])); } catch (e) { return e; } })()',
    "structuredClone's error": "(() => { try { structuredClone(() => 1); } catch (e) { return e; } })()",
    "URLSearchParams' error": "(() => { try { new URLSearchParams([[1]]); } catch (e) { return e; } })()",
}


def in_plain_node(exprs: list[str]) -> list[Any]:
    # The runtime's own Node.js binary, run plainly: no sandbox, no context.
    node = str(node_binary())
    program = SHOW + "process.stdout.write(JSON.stringify(JSON.parse(process.argv[1]).map(show)));"
    done = subprocess.run(
        [node, "-e", program, json.dumps(exprs)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return list(json.loads(done.stdout))


@pytest.fixture(scope="module")
def call(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Calls]:
    deployment = published(tmp_path_factory.mktemp("web"), "web", {"src/web.js": SOURCE})
    runner = PluginRunner(deployment, Bridge())
    try:
        yield Calls(deployment, runner)
    finally:
        runner.close()


def evaluate(call: Calls, exprs: list[str]) -> list[Any]:
    shown: list[Any] = []
    # A few at a time: a result is cut at the agent's tool_output_chars.
    for at in range(0, len(exprs), 10):
        result = call("web__evaluate", {"exprs": exprs[at : at + 10]})
        assert (result.is_error, result.outcome) == (False, "ok"), result.output
        shown.extend(json.loads(json.loads(result.output)))
    return shown


def test_each_global_behaves_as_nodes_own(call: Calls) -> None:
    inside = evaluate(call, CASES)
    oracle = in_plain_node(CASES)
    differ = [
        (expr, got, want)
        for expr, got, want in zip(CASES, inside, oracle, strict=True)
        if got != want
    ]
    assert not differ, "\n".join(f"{e}\n  inside: {g}\n  node:   {w}" for e, g, w in differ)


def test_the_errors_have_the_web_names(call: Calls) -> None:
    exprs = [
        '(() => { try { atob("a"); } catch (e) { return [e.name, e.code, e instanceof Error]; } })()',
        '(() => { try { btoa("\\u0100"); } catch (e) { return [e.name, e.code, e instanceof Error]; } })()',
        "(() => { try { structuredClone(Symbol()); } catch (e) { return [e.name, e.code, e instanceof Error]; } })()",
        '(() => { try { new URL("x"); } catch (e) { return [e.name, e.code, e.input]; } })()',
    ]
    assert evaluate(call, exprs) == [
        {"ok": ["InvalidCharacterError", 5, True]},
        {"ok": ["InvalidCharacterError", 5, True]},
        {"ok": ["DataCloneError", 25, True]},
        {"ok": ["TypeError", "ERR_INVALID_URL", "x"]},
    ]


@pytest.mark.parametrize("what", sorted(REACHABLE))
def test_no_global_leads_to_the_runtimes_realm(call: Calls, what: str) -> None:
    expr = REALM.replace("({})", f"({REACHABLE[what]})")
    # The context's own Function: its globalThis is the handler's, whose
    # `process` is the context's stand-in (no `versions`).
    assert evaluate(call, [expr]) == [{"ok": [True, "undefined"]}]
    # The oracle for the test itself: in plain node the same expression sees the process.
    assert in_plain_node([expr]) == [{"ok": [True, "object"]}]


def test_a_patched_prototype_is_not_seen_by_the_next_call(call: Calls) -> None:
    patch = [
        'URL.prototype.toString = () => "patched"; URLSearchParams.prototype.get = () => "patched";'
        ' globalThis.atob = () => "patched"; String(new URL("http://a/"))',
    ]
    assert evaluate(call, patch) == [{"ok": "patched"}]
    fresh = ['String(new URL("http://a/"))', 'new URLSearchParams("k=v").get("k")', 'atob("YQ==")']
    assert evaluate(call, fresh) == [{"ok": "http://a/"}, {"ok": "v"}, {"ok": "a"}]


def test_console_writes_go_to_host_log_at_their_level(call: Calls) -> None:
    result = call("web__console")
    assert (result.output, result.outcome) == ('"done"', "ok")
    assert [(e["level"], e["message"].splitlines()[0]) for e in result.logs] == [
        ("info", 'a 1 {"b":[2]} undefined'),
        ("info", "info"),
        ("warn", "Error: careful"),
        ("error", "bad 10"),
    ]
    # The stack of a logged Error names the plugin's file.
    assert "/plugin/src/web.js" in result.logs[2]["message"]


def test_a_console_level_the_sources_never_name_is_refused_quietly(call: Calls) -> None:
    # No `console.debug` in the sources: no host:log:debug, and the write goes nowhere.
    result = call("web__evaluate", {"exprs": ['console["debug"]("hidden") === undefined']})
    assert (json.loads(json.loads(result.output)), result.logs) == ([{"ok": True}], ())


def test_the_globals_are_writable_and_not_enumerable(call: Calls) -> None:
    exprs = [
        'Object.keys(globalThis).filter((k) => ["URL", "atob", "TextEncoder", "structuredClone"].includes(k))',
        "(() => { globalThis.btoa = 5; return btoa; })()",
        "typeof TextDecoder + typeof URLSearchParams",
    ]
    assert evaluate(call, exprs) == [{"ok": []}, {"ok": 5}, {"ok": "functionfunction"}]

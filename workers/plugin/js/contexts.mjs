// A long-lived isolate of a runtime process (runtime.mjs) whose plugin's sources are
// all scripts: it serves calls one after another, each in a FRESH vm context.
//
// The sources are compiled once per isolate; each context gets context.js first,
// then the sources run in it anew (their own globals, intrinsics and registry).
// The next call's context is made right after a call ends, off the next call's
// path. Only JSON text crosses between this outer realm and a context (see
// context.js): no object or function of this realm is ever handed in, the
// context's microtasks run only while this realm evaluates something in it
// (microtaskMode "afterEvaluate"), and `import()` rejects with a plain string.
// So a context can reach nothing here, and after its call nothing of it runs.
//
// Messages to the main thread are those of isolate.mjs: {op: "ready"},
// {op: "host", id, chain, args}, {op: "done", ..., recycle?}, {op: "registry", ...}.
// `recycle` asks the main thread for a new isolate (this one holds much memory).
import { parentPort, workerData } from "node:worker_threads";
import { readFileSync } from "node:fs";
import { getHeapStatistics } from "node:v8";
import process from "node:process";
import vm from "node:vm";

const { mode, root, heapMb } = workerData;
const IMPORT_REFUSED = "import() is not available: a plugin's sources are scripts, and handlers have no modules";
const refuseImport = () => {
  throw IMPORT_REFUSED; // a string: an Error made here would be an object of this realm
};
const compile = (code, filename) => new vm.Script(code, { filename, importModuleDynamically: refuseImport });
const bootstrap = compile(readFileSync(new URL("./context.js", import.meta.url), "utf8"), "/.vessel/runtime/context.js");
// The web globals (web.js with its parts in web/, joined in this order: each
// part uses what the ones before it define), run in each context after context.js.
const WEB_PARTS = ["encoding.js", "search.js", "urlparse.js", "url.js", "clone.js", "console.js"];
const webSource = readFileSync(new URL("./web.js", import.meta.url), "utf8").replace(
  "/* PARTS */",
  () => WEB_PARTS.map((part) => readFileSync(new URL(`./web/${part}`, import.meta.url), "utf8")).join("\n"),
);
const web = compile(webSource, "/.vessel/runtime/web.js");
const pump = compile("__vesselPump()", "/.vessel/runtime/pump");
const collect = compile("__vesselCollect()", "/.vessel/runtime/collect");
// Each source runs as Node runs a CommonJS file, in a function of its own (so two
// sources may each declare the same top-level names); the wrapper stays on the
// source's first line, so line numbers in errors are the file's.
function wrapped(code, filename) {
  const dir = filename.slice(0, filename.lastIndexOf("/")) || "/";
  return (
    "((module) => (function (exports, require, module, __filename, __dirname) {" +
    code +
    `\n}).call(module.exports, module.exports, globalThis.require, module, ${JSON.stringify(filename)}, ${JSON.stringify(dir)}))({ exports: {} });`
  );
}
const scripts = workerData.sources.map(({ source, code }) => {
  const filename = `${root}/${source}`;
  return { source, script: compile(wrapped(code, filename), filename) };
});
const LIMIT_BYTES = heapMb * 1024 * 1024;
// How often a waiting call's context is given a turn, for what settles outside
// any event of ours (an awaited WebAssembly.compile, Atomics.waitAsync).
const TICK_MS = 10;

// Deliver one event to a context and return what it sent since, as objects of this realm.
function enter(made, event) {
  made.g.__vesselIn = JSON.stringify(event);
  pump.runInContext(made.g);
  const text = collect.runInContext(made.g);
  const items = typeof text === "string" ? JSON.parse(text) : null;
  if (!Array.isArray(items)) throw new Error("the context's answer is not a list");
  return items;
}

function fresh() {
  const g = vm.createContext(vm.constants.DONT_CONTEXTIFY, {
    microtaskMode: "afterEvaluate",
    importModuleDynamically: refuseImport,
  });
  const made = { g, items: [] };
  bootstrap.runInContext(g);
  web.runInContext(g);
  for (const { source, script } of scripts) {
    let failed = false;
    try {
      script.runInContext(g);
    } catch (error) {
      // Handed back as it came (a value of the context's, never looked at here).
      g.__vesselError = error;
      failed = true;
    }
    made.items.push(...enter(made, { ev: failed ? "failed" : "sourced", source }));
    if (failed) break;
  }
  return made;
}

// A promise rejected in a context with no handler: V8 reports it to this
// realm's process, whose default would end the isolate, maybe during a later
// call. It belongs to a context that sees nothing of it; it is dropped, as a
// browser drops one (the reason is a context's value: never looked at here).
process.on("unhandledRejection", () => {});

let premade = null;
let active = null;

function broken(error) {
  const message = error instanceof Error ? error.message : "the handler broke its runtime";
  return [{ op: "done", ok: false, kind: "error", message: `the handler broke its runtime (${message})` }];
}

function deliver(call, event) {
  if (active !== call) return;
  let items;
  try {
    items = enter(call.made, event);
  } catch (error) {
    items = broken(error);
  }
  handle(call, items);
}

function handle(call, items) {
  for (const item of items) {
    if (active !== call || item === null || typeof item !== "object") return;
    switch (item.op) {
      case "host": {
        let args;
        try {
          args = JSON.parse(item.args);
        } catch {
          args = null;
        }
        if (!Array.isArray(args) || !Number.isSafeInteger(item.id) || typeof item.chain !== "string") {
          return end(call, broken(new Error("a malformed host call"))[0]);
        }
        parentPort.postMessage({ op: "host", id: item.id, chain: item.chain, args: JSON.stringify(args) });
        break;
      }
      case "timer": {
        const { id, ms } = item;
        if (!Number.isSafeInteger(id) || typeof ms !== "number") break;
        clearTimeout(call.timers.get(id));
        call.timers.set(
          id,
          setTimeout(() => {
            call.timers.delete(id);
            deliver(call, { ev: "fire", id });
          }, ms),
        );
        break;
      }
      case "clear":
        clearTimeout(call.timers.get(item.id));
        call.timers.delete(item.id);
        break;
      case "done":
        return end(call, item);
      default:
        break;
    }
  }
}

function end(call, done) {
  active = null;
  clearInterval(call.tick);
  for (const handle of call.timers.values()) clearTimeout(handle);
  call.timers.clear();
  const heap = getHeapStatistics();
  const recycle = heap.used_heap_size > LIMIT_BYTES * 0.75 || heap.external_memory > LIMIT_BYTES * 0.5;
  parentPort.postMessage({ ...done, recycle });
  if (!recycle) setImmediate(prepare);
}

function prepare() {
  if (premade === null && active === null) premade = fresh();
}

function start(message) {
  const made = premade ?? fresh();
  premade = null;
  const call = { made, timers: new Map(), tick: null };
  active = call;
  call.tick = setInterval(() => deliver(call, { ev: "tick" }), TICK_MS);
  handle(call, made.items);
  deliver(call, {
    ev: "call",
    key: message.key,
    input: JSON.stringify(message.input),
    context: JSON.stringify(message.context),
    keepChars: message.keepChars,
  });
}

if (mode === "register") {
  const made = fresh();
  const found = enter(made, { ev: "registry" }).find((item) => item && item.op === "registry");
  parentPort.postMessage(found ?? { op: "registry", failed: { kind: "error", message: "the sources gave no registry" } });
  // Stay up until the main thread has what it needs (the probe counts two isolates).
  parentPort.on("message", () => {});
} else {
  parentPort.on("message", (message) => {
    if (message.op === "call" && active === null) start(message);
    else if (message.op === "answer" && active !== null) {
      const event = "error" in message ? { ev: "answer", id: message.id, error: String(message.error) } : { ev: "answer", id: message.id, value: message.value };
      deliver(active, event);
    }
  });
  prepare();
  parentPort.postMessage({ op: "ready", error: null });
}

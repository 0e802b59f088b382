// What one call's fresh vm context holds before the plugin's sources run in it
// (contexts.mjs runs this script first in every new context).
//
// Nothing of the isolate's outer realm is reachable from here: the outer realm
// talks to this context only through JSON text. It sets `__vesselIn` (an event)
// and evaluates `__vesselPump()`, then `__vesselCollect()`, which returns what the
// context sent since (host calls, timers, the call's end) as JSON text. So every
// object a handler can touch was made in this context, and the context is
// dropped after its call: nothing one call leaves is seen by another.
//
// Events in:  {ev: "sourced", source} | {ev: "failed", source} | {ev: "registry"}
//             {ev: "call", key, input, context, keepChars} (input, context: JSON text)
//             {ev: "answer", id, value} | {ev: "answer", id, error} | {ev: "fire", id} | {ev: "tick"}
// Items out:  {op: "host", id, chain, args} (args: JSON text) | {op: "timer", id, ms}
//             {op: "clear", id} | {op: "done", ...} | {op: "registry", ...}
"use strict";
(() => {
  const G = globalThis;
  const root = "/plugin";
  // Captured before any plugin code runs: a handler that patches a built-in
  // breaks at most its own call, never this context's plumbing.
  const { parse, stringify } = JSON;
  const { apply } = Reflect;
  const { defineProperty, freeze, keys, getPrototypeOf, getOwnPropertyDescriptor } = Object;
  const ownKeys = Reflect.ownKeys;
  const isArray = Array.isArray;
  const PromiseOf = Promise;
  const resolved = Promise.resolve.bind(Promise);
  const allSettled = Promise.allSettled.bind(Promise);
  const then = Promise.prototype.then;
  const ObjectPrototype = Object.prototype;
  const RangeErrorOf = RangeError;
  const ErrorOf = Error;
  const mapGet = Map.prototype.get;
  const mapSet = Map.prototype.set;
  const mapHas = Map.prototype.has;
  const mapDelete = Map.prototype.delete;
  const mapSize = getOwnPropertyDescriptor(Map.prototype, "size").get;
  const regexTest = RegExp.prototype.test;
  const NOT_NOW = "the host API is not available while registering";
  // A member name: an identifier. Anything else ("a.b", "", symbols) would let a
  // built name read as another chain; the worker checks the chain it gets as is.
  const MEMBER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;
  const MAX_TIMERS = 10000;
  const LOG_CHAIN = /^log\./;
  const sources = [];

  let outbox = [];
  const send = (item) => {
    outbox[outbox.length] = item;
  };
  let inCall = false;
  let finished = false;
  let nextId = 0;
  const pending = new Map();
  const timers = new Map();
  let nextTimer = 0;
  let loadFailed = null;
  const written = []; // host.log calls in flight (console's too): the call ends after their answers
  const registeredBy = new Map();
  let manifestBy = null;
  let lastManifest;

  function describe(error) {
    if (error instanceof ErrorOf) return String(error.message);
    try {
      return String(error);
    } catch {
      return "a value that cannot be shown";
    }
  }

  // "<file>:<line>" of the first place in a plugin source named by the error.
  function where(error) {
    const stack = error instanceof ErrorOf && typeof error.stack === "string" ? error.stack : "";
    const found = stack.match(/\/plugin\/([^\s:()]+):(\d+)/);
    return found ? { file: found[1], line: Number(found[2]) } : null;
  }

  function hostCall(chain, args) {
    if (!inCall || finished) throw new ErrorOf(NOT_NOW);
    let payload;
    try {
      payload = stringify(args);
    } catch (error) {
      return PromiseOf.reject(new TypeError(`host.${chain}: the arguments are not JSON (${error.message})`));
    }
    const id = ++nextId;
    const answered = new PromiseOf((resolve, reject) => {
      apply(mapSet, pending, [id, { resolve, reject }]);
      send({ op: "host", id, chain, args: payload });
    });
    if (apply(regexTest, LOG_CHAIN, [chain])) written[written.length] = apply(then, answered, [undefined, () => undefined]);
    return answered;
  }

  function member(path) {
    const target = function host() {};
    return new Proxy(target, {
      get(_target, prop) {
        if (typeof prop !== "string" || prop === "then") return undefined;
        if (!apply(regexTest, MEMBER, [prop])) return undefined;
        return member(path ? `${path}.${prop}` : prop);
      },
      apply(_target, _this, args) {
        if (!path) throw new TypeError("host is not a function");
        return hostCall(path, args);
      },
      set: () => false,
      defineProperty: () => false,
      deleteProperty: () => false,
      setPrototypeOf: () => false,
      getPrototypeOf: () => null,
    });
  }

  function timer(fn, ms, args, repeat) {
    if (typeof fn !== "function") throw new TypeError("the timer's callback must be a function");
    if (apply(mapSize, timers, []) >= MAX_TIMERS) throw new RangeErrorOf(`at most ${MAX_TIMERS} timers may wait at once`);
    const id = ++nextTimer;
    const wait = Math.min(2147483647, Math.max(0, Math.floor(Number(ms)) || 0));
    apply(mapSet, timers, [id, { fn, args, repeat, wait }]);
    send({ op: "timer", id, ms: wait });
    return id;
  }

  function clear(id) {
    if (apply(mapDelete, timers, [id])) send({ op: "clear", id });
  }

  function fire(id) {
    const entry = apply(mapGet, timers, [id]);
    if (entry === undefined) return;
    if (entry.repeat) send({ op: "timer", id, ms: entry.wait });
    else apply(mapDelete, timers, [id]);
    try {
      apply(entry.fn, G, entry.args);
    } catch (error) {
      // What Node does with an uncaught exception: the call ends with it.
      end(failure(error, "error"));
    }
  }

  // No Node.js module, no process: a handler reaches the world only through `host`.
  function denied(what) {
    const error = new ErrorOf(`${what} is not available: plugin handlers run without Node.js modules or the process; use the host API`);
    error.code = "ERR_ACCESS_DENIED";
    return error;
  }
  const refuse = (what) =>
    function () {
      throw denied(what);
    };

  function isMemoryError(error) {
    return error instanceof RangeErrorOf && /allocation failed|out of memory/i.test(error.message);
  }

  function failure(error, kind) {
    return { op: "done", ok: false, kind: isMemoryError(error) ? "memory" : kind, message: describe(error) };
  }

  function end(done) {
    if (finished || !inCall) return;
    finished = true;
    send(done);
  }

  // Why `value` is not plain JSON (null, booleans, finite numbers, strings,
  // arrays and plain objects only), as [path, message], or null.
  function notJson(value, path, seen) {
    if (value === null || typeof value === "string" || typeof value === "boolean") return null;
    if (typeof value === "number") return Number.isFinite(value) ? null : [path, `${value} is not a JSON number`];
    if (typeof value !== "object") return [path, `is ${typeof value === "function" ? "a function" : `a ${typeof value}`}, not JSON`];
    if (seen.has(value)) return [path, "refers to itself (a cycle), not JSON"];
    seen.add(value);
    if (isArray(value)) {
      for (let i = 0; i < value.length; i++) {
        const found = notJson(value[i], [...path, i], seen);
        if (found) return found;
      }
    } else {
      const proto = getPrototypeOf(value);
      if (proto !== ObjectPrototype && proto !== null) {
        const name = proto && proto.constructor && typeof proto.constructor.name === "string" ? proto.constructor.name : "non-plain";
        return [path, `is a ${name} object, not plain JSON`];
      }
      for (const key of ownKeys(value)) {
        if (typeof key === "symbol") return [path, "has a symbol key, not JSON"];
        const d = getOwnPropertyDescriptor(value, key);
        if (!("value" in d)) return [[...path, key], "is a getter, not plain JSON"];
        if (!d.enumerable) return [[...path, key], "is not enumerable, not plain JSON"];
        const found = notJson(d.value, [...path, key], seen);
        if (found) return found;
      }
    }
    seen.delete(value);
    return null;
  }

  function field(entry, name) {
    try {
      return { value: entry[name] };
    } catch (error) {
      return { error: describe(error) };
    }
  }

  function kindOf(value) {
    if (value === null) return "null";
    if (isArray(value)) return "array";
    return typeof value;
  }

  function registry() {
    const tools = G.tools;
    const found = { tools: [], registryType: kindOf(tools), manifest: null, manifestSource: manifestBy };
    if (tools !== null && typeof tools === "object") {
      for (const key of keys(tools)) {
        const entry = field(tools, key);
        const item = { key, source: apply(mapGet, registeredBy, [key]) ?? sources[sources.length - 1] };
        if ("error" in entry) {
          item.error = entry.error;
        } else if (typeof entry.value === "function") {
          item.type = "function";
        } else if (entry.value === null || typeof entry.value !== "object") {
          item.type = kindOf(entry.value);
        } else {
          item.type = "object";
          for (const name of ["description", "handler", "parameters", "alwaysListed", "deferred"]) {
            const got = field(entry.value, name);
            if ("error" in got) {
              item[name] = { error: got.error };
              continue;
            }
            const v = got.value;
            if (name === "parameters" && v !== undefined) {
              const problem = notJson(v, [], new Set());
              item[name] = problem ? { type: kindOf(v), notJson: problem } : { type: kindOf(v), value: v };
            } else if (name === "handler") {
              item[name] = { type: kindOf(v) };
            } else {
              item[name] = { type: kindOf(v), value: typeof v === "string" || typeof v === "boolean" ? v : undefined };
            }
          }
        }
        found.tools.push(item);
      }
    }
    const manifest = G.manifest;
    if (manifest !== undefined) {
      const problem = notJson(manifest, [], new Set());
      found.manifest = problem ? { type: kindOf(manifest), notJson: problem } : { type: kindOf(manifest), value: manifest };
    }
    return found;
  }

  function deepFreeze(value) {
    if (value !== null && typeof value === "object") {
      for (const key of keys(value)) deepFreeze(value[key]);
      freeze(value);
    }
    return value;
  }

  async function run(event) {
    const { key, keepChars } = event;
    const tools = G.tools;
    const entry = tools !== null && typeof tools === "object" ? tools[key] : undefined;
    if (!entry || typeof entry.handler !== "function") {
      return { op: "done", ok: false, kind: "error", message: "this tool is no longer registered by the plugin's sources" };
    }
    let value;
    try {
      value = await entry.handler(parse(event.input), deepFreeze(parse(event.context)));
    } catch (error) {
      await allSettled(written);
      return failure(error, "error");
    }
    await allSettled(written);
    let text;
    try {
      text = stringify(value === undefined ? null : value);
    } catch (error) {
      return failure(error, "serialize");
    }
    if (text === undefined) {
      return { op: "done", ok: false, kind: "serialize", message: `returned ${kindOf(value) === "function" ? "a function" : `a ${kindOf(value)}`}, which JSON cannot hold` };
    }
    const total = text.length;
    return { op: "done", ok: true, text: total > keepChars ? text.slice(0, keepChars) : text, total };
  }

  function handle(event) {
    switch (event.ev) {
      case "sourced": {
        sources[sources.length] = event.source;
        const tools = G.tools;
        if (tools !== null && typeof tools === "object") {
          for (const key of keys(tools)) if (!apply(mapHas, registeredBy, [key])) apply(mapSet, registeredBy, [key, event.source]);
        }
        if (G.manifest !== lastManifest) {
          manifestBy = event.source;
          lastManifest = G.manifest;
        }
        break;
      }
      case "failed": {
        // The source's top level threw (the outer realm handed the error back as it came).
        const error = G.__vesselError;
        G.__vesselError = undefined;
        sources[sources.length] = event.source;
        const at = where(error);
        loadFailed = { source: event.source, file: at ? at.file : event.source, line: at ? at.line : null, message: describe(error) };
        break;
      }
      case "registry":
        send({ op: "registry", failed: loadFailed, ...(loadFailed ? {} : registry()) });
        break;
      case "call":
        if (loadFailed) {
          const { file, line, message } = loadFailed;
          inCall = true;
          end({ op: "done", ok: false, kind: "load", message: `${file}${line ? `:${line}` : ""}: ${message}` });
          break;
        }
        inCall = true;
        apply(then, run(event), [(done) => end(done), (error) => end(failure(error, "error"))]);
        break;
      case "answer": {
        const waiting = apply(mapGet, pending, [event.id]);
        if (waiting === undefined) break;
        apply(mapDelete, pending, [event.id]);
        if ("error" in event) waiting.reject(new ErrorOf(String(event.error)));
        else waiting.resolve(event.value === undefined ? null : event.value);
        break;
      }
      case "fire":
        fire(event.id);
        break;
      default:
        break;
    }
  }

  const hidden = (name, value) => defineProperty(G, name, { value, writable: false, configurable: false, enumerable: false });
  hidden("host", member(""));
  hidden("__vesselPump", () => {
    const text = G.__vesselIn;
    G.__vesselIn = undefined;
    let event;
    try {
      event = parse(text);
    } catch {
      return;
    }
    try {
      handle(event);
    } catch (error) {
      end(failure(error, "error"));
    }
  });
  hidden("__vesselCollect", () => {
    const items = outbox;
    outbox = [];
    try {
      return stringify(items);
    } catch (error) {
      return stringify([failure(error, "error")]);
    }
  });
  G.__vesselIn = undefined;
  G.__vesselError = undefined;
  G.tools = {};
  G.setTimeout = (fn, ms, ...args) => timer(fn, ms, args, false);
  G.setInterval = (fn, ms, ...args) => timer(fn, ms, args, true);
  G.clearTimeout = clear;
  G.clearInterval = clear;
  G.queueMicrotask = (fn) => {
    if (typeof fn !== "function") throw new TypeError("queueMicrotask needs a function");
    apply(then, resolved(), [() => fn()]);
  };
  G.require = function require(name) {
    throw denied(`require(${stringify(String(name))})`);
  };
  G.process = freeze({
    env: freeze({}),
    argv: freeze([]),
    pid: 1,
    platform: "linux",
    exit: refuse("process.exit"),
    kill: refuse("process.kill"),
    binding: refuse("process.binding"),
    getBuiltinModule(name) {
      throw denied(`process.getBuiltinModule(${stringify(String(name))})`);
    },
  });
  // Its callbacks would run outside any call, after the call that made them.
  delete G.FinalizationRegistry;
})();

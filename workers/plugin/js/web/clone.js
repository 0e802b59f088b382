// structuredClone for plain data: primitives, plain objects and arrays, boxed
// primitives, Date, RegExp, Map, Set, Error, ArrayBuffer, typed arrays and
// DataView, with shared references and cycles kept. Functions, symbols and
// other objects with internal state (Promise, WeakMap, ...) throw DataCloneError.
// Part of the web globals script (see ../web.js for how the parts are joined).

lazy("structuredClone", () => {
  const toTag = Object.prototype.toString;
  const tagOf = (v) => toTag.call(v).slice(8, -1);
  const ERRORS = { Error, EvalError, RangeError, ReferenceError, SyntaxError, TypeError, URIError };
  const refuse = (what) => domError("DataCloneError", `${what} could not be cloned.`, 25);
  const typedName = Object.getOwnPropertyDescriptor(Object.getPrototypeOf(Uint8Array.prototype), Symbol.toStringTag).get;
  const has = (proto, name, v) => {
    try {
      Object.getOwnPropertyDescriptor(proto, name).get.call(v);
      return true;
    } catch {
      return false;
    }
  };
  const TYPED = { Int8Array, Uint8Array, Uint8ClampedArray, Int16Array, Uint16Array, Int32Array, Uint32Array, Float32Array, Float64Array, BigInt64Array, BigUint64Array };

  function clone(value, memo) {
    if (typeof value === "symbol") throw refuse(String(value));
    if (typeof value === "function") throw refuse(`${value.name ? `function ${value.name}` : "a function"}`);
    if (value === null || typeof value !== "object") return value;
    if (memo.has(value)) return memo.get(value);
    const keep = (made) => {
      memo.set(value, made);
      return made;
    };
    const name = typedName.call(value);
    if (name !== undefined) {
      const buffer = clone(value.buffer, memo);
      return keep(new TYPED[name](buffer, value.byteOffset, value.length));
    }
    if (has(ArrayBuffer.prototype, "byteLength", value)) return keep(value.slice(0));
    if (typeof SharedArrayBuffer === "function" && has(SharedArrayBuffer.prototype, "byteLength", value)) return keep(value);
    if (has(DataView.prototype, "byteLength", value)) return keep(new DataView(clone(value.buffer, memo), value.byteOffset, value.byteLength));
    if (has(Map.prototype, "size", value)) {
      const made = keep(new Map());
      for (const [k, v] of Map.prototype.entries.call(value)) made.set(clone(k, memo), clone(v, memo));
      return made;
    }
    if (has(Set.prototype, "size", value)) {
      const made = keep(new Set());
      for (const v of Set.prototype.values.call(value)) made.add(clone(v, memo));
      return made;
    }
    if (has(RegExp.prototype, "flags", value) && tagOf(value) === "RegExp") return keep(new RegExp(value.source, value.flags));
    const tag = tagOf(value);
    if (tag === "Date") return keep(new Date(Date.prototype.getTime.call(value)));
    if (tag === "Boolean") return keep(Object(Boolean.prototype.valueOf.call(value)));
    if (tag === "Number") return keep(Object(Number.prototype.valueOf.call(value)));
    if (tag === "String") return keep(Object(String.prototype.valueOf.call(value)));
    if (tag === "BigInt") return keep(Object(BigInt.prototype.valueOf.call(value)));
    if (tag === "Error") {
      const kind = Object.prototype.hasOwnProperty.call(ERRORS, value.name) ? ERRORS[value.name] : Error;
      const made = keep(Object.create(kind.prototype));
      const message = Object.getOwnPropertyDescriptor(value, "message");
      if (message !== undefined) Object.defineProperty(made, "message", { value: String(value.message), writable: true, configurable: true });
      Object.defineProperty(made, "stack", { value: String(value.stack), writable: true, configurable: true });
      if ("cause" in value) Object.defineProperty(made, "cause", { value: clone(value.cause, memo), writable: true, configurable: true });
      return made;
    }
    if (Array.isArray(value)) {
      const made = keep(new Array(value.length));
      for (const key of Object.keys(value)) made[key] = clone(value[key], memo);
      return made;
    }
    if (tag !== "Object" && tag !== "Arguments") throw refuse(`#<${tag}>`);
    if (value instanceof Promise || value instanceof WeakMap || value instanceof WeakSet || value instanceof WeakRef) throw refuse(`#<${value.constructor.name}>`);
    const made = keep({});
    for (const key of Object.keys(value)) made[key] = clone(value[key], memo);
    return made;
  }

  return function structuredClone(value, options = undefined) {
    if (arguments.length === 0) throw new TypeError("The \"value\" argument must be specified");
    if (options !== undefined && options !== null && options.transfer !== undefined && Array.from(options.transfer).length > 0) {
      throw domError("DataCloneError", "transfer is not supported inside a plugin handler", 25);
    }
    return clone(value, new Map());
  };
});

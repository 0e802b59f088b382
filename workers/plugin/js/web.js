// The web-standard globals a handler has in its context: URL, URLSearchParams,
// TextEncoder, TextDecoder, atob, btoa, structuredClone, and console (to
// host.log). contexts.mjs joins this file and the parts in web/ into one
// script, compiled once per isolate and run in every new context, so every object here is the context's own (no
// object of the runtime's realm is handed in). Each global is an accessor that
// builds its value on first use and then becomes a plain writable property:
// making a context costs a few accessors, not the classes.
//
// The parts (web/*.js) share this function's scope, in the order contexts.mjs lists them.
"use strict";
(() => {
  const G = globalThis;
  function lazy(name, build) {
    const settle = (value) => Object.defineProperty(G, name, { value, writable: true, configurable: true, enumerable: false });
    Object.defineProperty(G, name, {
      get() {
        const value = build();
        settle(value);
        return value;
      },
      set(value) {
        settle(value);
      },
      configurable: true,
      enumerable: false,
    });
  }
  // What a browser throws as a DOMException: an Error of that name, with its legacy code.
  function domError(name, message, code) {
    const error = new Error(message);
    Object.defineProperty(error, "name", { value: name, writable: true, configurable: true });
    Object.defineProperty(error, "code", { value: code, writable: true, configurable: true });
    return error;
  }
  function defineTag(cls, tag) {
    Object.defineProperty(cls.prototype, Symbol.toStringTag, { value: tag, configurable: true });
  }
  /* PARTS */
})();

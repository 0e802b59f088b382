// Percent-encoding (the WHATWG URL standard's sets), the
// application/x-www-form-urlencoded format, and URLSearchParams.
// Part of the web globals script (see ../web.js for how the parts are joined).

const HEX = "0123456789ABCDEF";
const setOf = (base, extra) => {
  const set = new Set(base);
  for (const ch of extra) set.add(ch.charCodeAt(0));
  return set;
};
// Beyond these, every byte outside 0x20..0x7E is encoded (the C0 control set).
const FRAGMENT_SET = setOf([], ' "<>`');
const QUERY_SET = setOf([], ' "#<>');
const SPECIAL_QUERY_SET = setOf(QUERY_SET, "'");
const PATH_SET = setOf(QUERY_SET, "?^`{}");
const USERINFO_SET = setOf(PATH_SET, "/:;=@[\\]^|");
const COMPONENT_SET = setOf(USERINFO_SET, "$%&+,");
const FORM_SET = setOf(COMPONENT_SET, "!'()~");
const C0_SET = setOf([], "");

function percentEncode(text, set, spaceAsPlus = false) {
  let out = "";
  for (const b of utf8Bytes(text)) {
    if (spaceAsPlus && b === 0x20) out += "+";
    else if (b < 0x20 || b > 0x7e || set.has(b)) out += `%${HEX[b >> 4]}${HEX[b & 15]}`;
    else out += String.fromCharCode(b);
  }
  return out;
}

const isHex = (c) => (c >= 48 && c <= 57) || (c >= 65 && c <= 70) || (c >= 97 && c <= 102);

// The bytes `text` percent-decodes to (a `%` not followed by two hex digits stays).
function percentDecodeBytes(text) {
  const bytes = utf8Bytes(text);
  const out = [];
  for (let i = 0; i < bytes.length; i++) {
    if (bytes[i] === 37 && i + 2 < bytes.length && isHex(bytes[i + 1]) && isHex(bytes[i + 2])) {
      out.push(parseInt(String.fromCharCode(bytes[i + 1], bytes[i + 2]), 16));
      i += 2;
    } else {
      out.push(bytes[i]);
    }
  }
  return out;
}

const decodeUtf8 = (bytes) => utf8Text(bytes, 0, bytes.length, false, true)[0];

function formParse(text) {
  const list = [];
  for (const piece of text.split("&")) {
    if (piece === "") continue;
    const at = piece.indexOf("=");
    const name = at < 0 ? piece : piece.slice(0, at);
    const value = at < 0 ? "" : piece.slice(at + 1);
    list.push([decodeUtf8(percentDecodeBytes(name.replace(/\+/g, " "))), decodeUtf8(percentDecodeBytes(value.replace(/\+/g, " ")))]);
  }
  return list;
}

const formSerialize = (list) => list.map(([n, v]) => `${percentEncode(n, FORM_SET, true)}=${percentEncode(v, FORM_SET, true)}`).join("&");

// A string as a USVString (lone surrogates become U+FFFD).
const usv = (value) => String(value).replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, "\ufffd");

// Each URLSearchParams' list and the URL it belongs to (if any); the URL
// module reads and writes these (`searchState`).
const searchState = new WeakMap();

let searchParamsClass = null;
const searchParams = () => (searchParamsClass ??= buildSearchParams());
lazy("URLSearchParams", searchParams);
function buildSearchParams() {
  const own = (params) => {
    const s = searchState.get(params);
    if (s === undefined) throw new TypeError("Value of \"this\" must be of type URLSearchParams");
    return s;
  };
  const changed = (s) => {
    if (s.url !== null) s.url.searchChanged(s.list.length ? formSerialize(s.list) : null);
  };
  class URLSearchParams {
    constructor(init = undefined) {
      let list = [];
      if (init !== undefined && init !== null && (typeof init === "object" || typeof init === "function")) {
        if (typeof init[Symbol.iterator] === "function") {
          for (const pair of init) {
            if (pair === null || (typeof pair !== "object" && typeof pair !== "function") || typeof pair[Symbol.iterator] !== "function") {
              throw new TypeError("Each query pair must be an iterable [name, value] tuple");
            }
            const items = Array.from(pair);
            if (items.length !== 2) throw new TypeError("Each query pair must be an iterable [name, value] tuple");
            list.push([usv(items[0]), usv(items[1])]);
          }
        } else {
          for (const key of Reflect.ownKeys(init)) {
            const d = Reflect.getOwnPropertyDescriptor(init, key);
            if (d === undefined || !d.enumerable) continue;
            if (typeof key === "symbol") throw new TypeError("Cannot convert a Symbol value to a string");
            list.push([usv(key), usv(init[key])]);
          }
        }
      } else if (init !== undefined) {
        const text = usv(init);
        list = formParse(text[0] === "?" ? text.slice(1) : text);
      }
      searchState.set(this, { list, url: null });
    }
    get size() {
      return own(this).list.length;
    }
    append(name, value) {
      if (arguments.length < 2) throw new TypeError("The \"name\" and \"value\" arguments must be specified");
      const s = own(this);
      s.list.push([usv(name), usv(value)]);
      changed(s);
    }
    delete(name, value = undefined) {
      const s = own(this);
      const n = usv(name);
      const v = value === undefined ? undefined : usv(value);
      s.list = s.list.filter(([k, x]) => k !== n || (v !== undefined && x !== v));
      changed(s);
    }
    get(name) {
      const n = usv(name);
      const found = own(this).list.find(([k]) => k === n);
      return found ? found[1] : null;
    }
    getAll(name) {
      const n = usv(name);
      return own(this).list.filter(([k]) => k === n).map(([, v]) => v);
    }
    has(name, value = undefined) {
      const n = usv(name);
      const v = value === undefined ? undefined : usv(value);
      return own(this).list.some(([k, x]) => k === n && (v === undefined || x === v));
    }
    set(name, value) {
      if (arguments.length < 2) throw new TypeError("The \"name\" and \"value\" arguments must be specified");
      const s = own(this);
      const n = usv(name);
      const v = usv(value);
      const at = s.list.findIndex(([k]) => k === n);
      if (at < 0) s.list.push([n, v]);
      else {
        s.list = s.list.filter(([k], i) => k !== n || i <= at);
        s.list[at] = [n, v];
      }
      changed(s);
    }
    sort() {
      const s = own(this);
      // Stable, by UTF-16 code units of the names (Array.prototype.sort is stable).
      s.list.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
      changed(s);
    }
    forEach(callback, thisArg = undefined) {
      if (typeof callback !== "function") throw new TypeError("The \"callback\" argument must be of type function");
      const s = own(this);
      for (let i = 0; i < s.list.length; i++) callback.call(thisArg, s.list[i][1], s.list[i][0], this);
    }
    *entries() {
      const s = own(this);
      for (let i = 0; i < s.list.length; i++) yield [s.list[i][0], s.list[i][1]];
    }
    *keys() {
      for (const [k] of this.entries()) yield k;
    }
    *values() {
      for (const [, v] of this.entries()) yield v;
    }
    toString() {
      return formSerialize(own(this).list);
    }
  }
  Object.defineProperty(URLSearchParams.prototype, Symbol.iterator, {
    value: URLSearchParams.prototype.entries,
    writable: true,
    configurable: true,
  });
  defineTag(URLSearchParams, "URLSearchParams");
  return URLSearchParams;
}

// TextEncoder / TextDecoder (UTF-8 only) and atob / btoa, in the context's own realm.
// Part of the web globals script (see ../web.js for how the parts are joined).

// A string's UTF-8 bytes; a lone surrogate is U+FFFD (a USVString, as the web has it).
function utf8Bytes(text) {
  const out = [];
  for (let i = 0; i < text.length; i++) {
    let c = text.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdfff) {
      const next = i + 1 < text.length ? text.charCodeAt(i + 1) : 0;
      if (c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
        c = 0x10000 + ((c - 0xd800) << 10) + (next - 0xdc00);
        i++;
      } else {
        c = 0xfffd;
      }
    }
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
  }
  return out;
}

// The WHATWG UTF-8 decoder over bytes[start, end): [text, index where an
// unfinished sequence begins (for streaming)], or throws at an invalid byte when `fatal`.
function utf8Text(bytes, start, end, fatal, final) {
  const units = [];
  let text = "";
  let i = start;
  const bad = () => {
    if (fatal) throw new TypeError("The encoded data was not valid for encoding utf-8");
    units.push(0xfffd);
  };
  while (i < end) {
    const b = bytes[i];
    if (b < 0x80) {
      units.push(b);
      i++;
    } else {
      let need = 0;
      let cp = 0;
      let lower = 0x80;
      let upper = 0xbf;
      if (b >= 0xc2 && b <= 0xdf) {
        need = 1;
        cp = b & 0x1f;
      } else if (b >= 0xe0 && b <= 0xef) {
        if (b === 0xe0) lower = 0xa0;
        if (b === 0xed) upper = 0x9f;
        need = 2;
        cp = b & 0xf;
      } else if (b >= 0xf0 && b <= 0xf4) {
        if (b === 0xf0) lower = 0x90;
        if (b === 0xf4) upper = 0x8f;
        need = 3;
        cp = b & 0x7;
      } else {
        bad();
        i++;
        continue;
      }
      let j = i + 1;
      let seen = 0;
      while (seen < need && j < end && bytes[j] >= lower && bytes[j] <= upper) {
        cp = (cp << 6) | (bytes[j] & 0x3f);
        lower = 0x80;
        upper = 0xbf;
        j++;
        seen++;
      }
      if (seen < need) {
        if (j === end && !final) return [text + String.fromCharCode.apply(null, units), i];
        bad();
        i = j; // the maximal subpart is replaced once; the byte that broke it is read anew
        continue;
      }
      if (cp >= 0x10000) units.push(0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
      else units.push(cp);
      i = j;
    }
    if (units.length > 8192) {
      text += String.fromCharCode.apply(null, units);
      units.length = 0;
    }
  }
  return [text + String.fromCharCode.apply(null, units), end];
}

lazy("TextEncoder", () => {
  class TextEncoder {
    get encoding() {
      return "utf-8";
    }
    encode(input = "") {
      return new Uint8Array(utf8Bytes(String(input)));
    }
    encodeInto(source, destination) {
      if (!(destination instanceof Uint8Array)) throw new TypeError("The \"dest\" argument must be an instance of Uint8Array.");
      const text = String(source);
      let read = 0;
      let written = 0;
      for (let i = 0; i < text.length; ) {
        const c = text.codePointAt(i);
        const units = c > 0xffff ? 2 : 1;
        const bytes = utf8Bytes(text.slice(i, i + units));
        if (written + bytes.length > destination.length) break;
        for (const b of bytes) destination[written++] = b;
        read += units;
        i += units;
      }
      return { read, written };
    }
  }
  defineTag(TextEncoder, "TextEncoder");
  return TextEncoder;
});

const UTF8_LABELS = ["unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "utf-8", "utf8", "x-unicode20utf8"];

// The bytes of a BufferSource, as a Uint8Array over the same memory.
function bytesOf(input, what) {
  if (input instanceof ArrayBuffer || (typeof SharedArrayBuffer === "function" && input instanceof SharedArrayBuffer)) return new Uint8Array(input);
  if (ArrayBuffer.isView(input)) return new Uint8Array(input.buffer, input.byteOffset, input.byteLength);
  throw new TypeError(`${what}: the input must be an ArrayBuffer or an ArrayBufferView`);
}

lazy("TextDecoder", () => {
  const state = new WeakMap();
  const own = (decoder) => {
    const s = state.get(decoder);
    if (s === undefined) throw new TypeError("Illegal invocation: not a TextDecoder");
    return s;
  };
  class TextDecoder {
    constructor(label = "utf-8", options = {}) {
      const name = String(label).trim().toLowerCase();
      if (!UTF8_LABELS.includes(name)) throw new RangeError(`The "${label}" encoding is not supported (only UTF-8 is)`);
      const opts = options === null || options === undefined ? {} : options;
      state.set(this, { fatal: Boolean(opts.fatal), ignoreBOM: Boolean(opts.ignoreBOM), pending: [], started: false });
    }
    get encoding() {
      own(this);
      return "utf-8";
    }
    get fatal() {
      return own(this).fatal;
    }
    get ignoreBOM() {
      return own(this).ignoreBOM;
    }
    decode(input = undefined, options = {}) {
      const s = own(this);
      const stream = Boolean(options && options.stream);
      let bytes = input === undefined ? new Uint8Array(0) : bytesOf(input, "TextDecoder.decode");
      if (s.pending.length) {
        const joined = new Uint8Array(s.pending.length + bytes.length);
        joined.set(s.pending, 0);
        joined.set(bytes, s.pending.length);
        bytes = joined;
        s.pending = [];
      }
      let start = 0;
      if (!s.started && !s.ignoreBOM) {
        if (bytes.length < 3 && stream && [0xef, 0xbb, 0xbf].slice(0, bytes.length).every((b, k) => bytes[k] === b)) {
          s.pending = Array.from(bytes);
          return "";
        }
        if (bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf) start = 3;
      }
      if (bytes.length > 0) s.started = true;
      let text;
      let stop;
      try {
        [text, stop] = utf8Text(bytes, start, bytes.length, s.fatal, !stream);
      } catch (error) {
        s.started = false;
        throw error;
      }
      s.pending = Array.from(bytes.subarray(stop));
      if (!stream) s.started = false;
      return text;
    }
  }
  defineTag(TextDecoder, "TextDecoder");
  return TextDecoder;
});

const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

lazy("btoa", () =>
  function btoa(data) {
    if (arguments.length === 0) throw new TypeError("The \"data\" argument must be specified");
    const text = String(data);
    let out = "";
    for (let i = 0; i < text.length; i += 3) {
      const a = text.charCodeAt(i);
      const b = i + 1 < text.length ? text.charCodeAt(i + 1) : 0;
      const c = i + 2 < text.length ? text.charCodeAt(i + 2) : 0;
      if (a > 255 || b > 255 || c > 255) throw domError("InvalidCharacterError", "Invalid character", 5);
      out += B64[a >> 2] + B64[((a & 3) << 4) | (b >> 4)];
      out += i + 1 < text.length ? B64[((b & 15) << 2) | (c >> 6)] : "=";
      out += i + 2 < text.length ? B64[c & 63] : "=";
    }
    return out;
  },
);

lazy("atob", () =>
  function atob(data) {
    if (arguments.length === 0) throw new TypeError("The \"data\" argument must be specified");
    let text = String(data).replace(/[\t\n\f\r ]/g, "");
    if (text.length % 4 === 0) text = text.replace(/==?$/, "");
    if (text.length % 4 === 1 || /[^A-Za-z0-9+/]/.test(text)) {
      throw domError("InvalidCharacterError", "The string to be decoded is not correctly encoded.", 5);
    }
    let out = "";
    let bits = 0;
    let count = 0;
    for (let i = 0; i < text.length; i++) {
      bits = (bits << 6) | B64.indexOf(text[i]);
      count += 6;
      if (count >= 8) {
        count -= 8;
        out += String.fromCharCode((bits >> count) & 255);
      }
    }
    return out;
  },
);

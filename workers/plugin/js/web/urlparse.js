// The WHATWG URL parser and serializer (without IDNA: a host with non-ASCII
// letters is refused), over a record {scheme, username, password, host, port,
// path (segments, or a string when opaque), query, fragment}.
// Part of the web globals script (see ../web.js for how the parts are joined).

const DEFAULT_PORTS = { ftp: 21, file: null, http: 80, https: 443, ws: 80, wss: 443 };
const isSpecial = (scheme) => Object.prototype.hasOwnProperty.call(DEFAULT_PORTS, scheme);
const SCHEME = /^[A-Za-z][A-Za-z0-9+.-]*$/;
const FORBIDDEN_HOST = /[\u0000\t\n\r #/:<>?@[\\\]^|]/;
const FORBIDDEN_DOMAIN = /[\u0000-\u001f #%/:<>?@[\\\]^|\u007f]/;
const SINGLE_DOT = /^(\.|%2e)$/i;
const DOUBLE_DOT = /^(\.|%2e)(\.|%2e)$/i;

function ipv4Number(part) {
  let radix = 10;
  let digits = part;
  if (/^0[xX]/.test(part)) {
    radix = 16;
    digits = part.slice(2);
  } else if (part.length > 1 && part[0] === "0") {
    radix = 8;
    digits = part.slice(1);
  }
  if (digits === "") return 0;
  const valid = radix === 16 ? /^[0-9a-fA-F]+$/ : radix === 8 ? /^[0-7]+$/ : /^[0-9]+$/;
  return valid.test(digits) ? parseInt(digits, radix) : NaN;
}

function endsInNumber(host) {
  const parts = host.split(".");
  if (parts[parts.length - 1] === "" && parts.length > 1) parts.pop();
  const last = parts[parts.length - 1];
  return /^[0-9]+$/.test(last) || /^0[xX][0-9a-fA-F]*$/.test(last);
}

function ipv4(host) {
  const parts = host.split(".");
  if (parts[parts.length - 1] === "" && parts.length > 1) parts.pop();
  if (parts.length > 4) return null;
  const numbers = parts.map((p) => (p === "" ? NaN : ipv4Number(p)));
  if (numbers.some((n) => Number.isNaN(n))) return null;
  for (let i = 0; i < numbers.length - 1; i++) if (numbers[i] > 255) return null;
  let value = numbers[numbers.length - 1];
  if (value >= 256 ** (5 - numbers.length)) return null;
  for (let i = 0; i < numbers.length - 1; i++) value += numbers[i] * 256 ** (3 - i);
  return [value >>> 24, (value >>> 16) & 255, (value >>> 8) & 255, value & 255].join(".");
}

function ipv6(text) {
  const pieces = [0, 0, 0, 0, 0, 0, 0, 0];
  let at = 0;
  let compress = null;
  let i = 0;
  if (text[0] === ":") {
    if (text[1] !== ":") return null;
    i = 2;
    compress = ++at;
  }
  while (i < text.length) {
    if (at === 8) return null;
    if (text[i] === ":") {
      if (compress !== null) return null;
      i++;
      compress = ++at;
      continue;
    }
    let value = 0;
    let length = 0;
    while (length < 4 && i < text.length && /[0-9a-fA-F]/.test(text[i])) {
      value = value * 16 + parseInt(text[i], 16);
      i++;
      length++;
    }
    if (text[i] === ".") {
      if (length === 0 || at > 6) return null;
      const v4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(text.slice(i - length));
      if (!v4 || v4.slice(1).some((n) => (n.length > 1 && n[0] === "0") || Number(n) > 255)) return null;
      pieces[at++] = Number(v4[1]) * 256 + Number(v4[2]);
      pieces[at++] = Number(v4[3]) * 256 + Number(v4[4]);
      i = text.length;
      break;
    }
    if (text[i] === ":") {
      i++;
      if (i === text.length) return null;
    } else if (i < text.length) return null;
    pieces[at++] = value;
  }
  if (compress !== null) {
    let swaps = at - compress;
    at = 7;
    while (at !== 0 && swaps > 0) {
      const j = compress + swaps - 1;
      [pieces[at], pieces[j]] = [pieces[j], pieces[at]];
      at--;
      swaps--;
    }
  } else if (at !== 8) return null;
  // Serialize: the first longest run of two or more zero pieces becomes "::".
  let best = -1;
  let bestLength = 1;
  for (let s = 0; s < 8; s++) {
    let e = s;
    while (e < 8 && pieces[e] === 0) e++;
    if (e - s > bestLength) {
      best = s;
      bestLength = e - s;
    }
  }
  let out = "";
  for (let k = 0; k < 8; k++) {
    if (k === best) {
      out += k === 0 ? "::" : ":";
      k += bestLength - 1;
      continue;
    }
    out += pieces[k].toString(16) + (k < 7 ? ":" : "");
  }
  return `[${out}]`;
}

// A host's serialization, or null when it is not a valid host.
function parseHost(text, special) {
  if (text[0] === "[") return text[text.length - 1] === "]" ? ipv6(text.slice(1, -1)) : null;
  if (!special) return FORBIDDEN_HOST.test(text) ? null : percentEncode(text, C0_SET);
  const domain = decodeUtf8(percentDecodeBytes(text)).toLowerCase();
  if (domain === "" || /[^\u0000-\u007f]/.test(domain) || FORBIDDEN_DOMAIN.test(domain)) return null;
  return endsInNumber(domain) ? ipv4(domain) : domain;
}

// "host[:port]" as [host, port (null: default or none; undefined: not given)], or null.
function parseHostPort(text, scheme) {
  const close = text[0] === "[" ? text.indexOf("]") : -1;
  const colon = text.indexOf(":", close < 0 ? 0 : close);
  const hostText = colon < 0 ? text : text.slice(0, colon);
  if (hostText === "" && isSpecial(scheme)) return null;
  const host = hostText === "" ? "" : parseHost(hostText, isSpecial(scheme));
  if (host === null) return null;
  let port;
  if (colon >= 0) {
    const digits = text.slice(colon + 1);
    if (!/^[0-9]*$/.test(digits)) return null;
    if (digits === "") port = null;
    else {
      port = Number(digits);
      if (port > 65535) return null;
      if (port === DEFAULT_PORTS[scheme]) port = null;
    }
  }
  return [host, port];
}

// Adds the path segments of `text` to `path`, resolving "." and "..".
function addPath(path, text, special) {
  const segments = text.split(special ? /[/\\]/ : "/");
  for (let k = 0; k < segments.length; k++) {
    const segment = segments[k];
    const last = k === segments.length - 1;
    if (DOUBLE_DOT.test(segment)) {
      path.pop();
      if (last) path.push("");
    } else if (SINGLE_DOT.test(segment)) {
      if (last) path.push("");
    } else {
      path.push(percentEncode(segment, PATH_SET));
    }
  }
  return path;
}

// Path, query and fragment of `rest` onto `url`; `path` is where the path starts.
function finish(url, rest, path) {
  const hashAt = rest.indexOf("#");
  const fragment = hashAt < 0 ? null : rest.slice(hashAt + 1);
  const beforeHash = hashAt < 0 ? rest : rest.slice(0, hashAt);
  const queryAt = beforeHash.indexOf("?");
  const query = queryAt < 0 ? null : beforeHash.slice(queryAt + 1);
  const pathText = queryAt < 0 ? beforeHash : beforeHash.slice(0, queryAt);
  const special = isSpecial(url.scheme);
  if (pathText !== "") addPath(path, /^[/\\]/.test(pathText) && (special || pathText[0] === "/") ? pathText.slice(1) : pathText, special);
  else if (special && path.length === 0) path.push("");
  url.path = path;
  url.query = query === null ? null : percentEncode(query, special ? SPECIAL_QUERY_SET : QUERY_SET);
  url.fragment = fragment === null ? null : percentEncode(fragment, FRAGMENT_SET);
  return url;
}

function withAuthority(scheme, rest) {
  const special = isSpecial(scheme);
  const end = rest.search(special ? /[/\\?#]/ : /[/?#]/);
  const authority = end < 0 ? rest : rest.slice(0, end);
  const tail = end < 0 ? "" : rest.slice(end);
  const at = authority.lastIndexOf("@");
  const url = { scheme, username: "", password: "", host: null, port: null, path: [], query: null, fragment: null };
  if (at >= 0) {
    const info = authority.slice(0, at);
    const colon = info.indexOf(":");
    url.username = percentEncode(colon < 0 ? info : info.slice(0, colon), USERINFO_SET);
    url.password = colon < 0 ? "" : percentEncode(info.slice(colon + 1), USERINFO_SET);
  }
  const hostPort = authority.slice(at + 1);
  if (at >= 0 && hostPort === "") return null;
  if (scheme === "file") {
    const host = hostPort === "" ? "" : parseHost(hostPort, true);
    if (host === null) return null;
    url.host = host === "localhost" ? "" : host;
    return finish(url, tail, []);
  }
  const parsed = parseHostPort(hostPort, scheme);
  if (parsed === null) return null;
  [url.host, url.port] = [parsed[0], parsed[1] ?? null];
  return finish(url, tail, []);
}

const copy = (url) => ({ ...url, path: typeof url.path === "string" ? url.path : url.path.slice() });

function relative(rest, base) {
  const special = isSpecial(base.scheme);
  const slash = special ? /^[/\\]/ : /^\//;
  if (slash.test(rest) && slash.test(rest.slice(1))) {
    if (base.scheme === "file") return withAuthority("file", rest.slice(2));
    return withAuthority(base.scheme, special ? rest.replace(/^[/\\]+/, "") : rest.slice(2));
  }
  const url = copy(base);
  url.fragment = null;
  if (slash.test(rest)) return finish(url, rest, []);
  if (rest === "") return url;
  if (rest[0] === "#") {
    url.fragment = percentEncode(rest.slice(1), FRAGMENT_SET);
    return url;
  }
  if (rest[0] === "?") return finish(url, rest, base.path.slice());
  return finish(url, rest, base.path.slice(0, -1));
}

// The record of `input` against `base` (a record or null), or null when it is not a URL.
function parseURL(input, base) {
  const text = usv(input).replace(/^[\u0000-\u0020]+|[\u0000-\u0020]+$/g, "").replace(/[\t\n\r]/g, "");
  const m = /^([A-Za-z][A-Za-z0-9+.-]*):/.exec(text);
  if (m === null) {
    if (base === null) return null;
    if (typeof base.path === "string") {
      if (text[0] !== "#") return null;
      return { ...base, fragment: percentEncode(text.slice(1), FRAGMENT_SET) };
    }
    return relative(text, base);
  }
  const scheme = m[1].toLowerCase();
  const rest = text.slice(m[0].length);
  if (scheme === "file") {
    if (/^[/\\]{2}/.test(rest)) return withAuthority("file", rest.slice(2));
    if (base !== null && base.scheme === "file") return relative(rest, base);
    return finish({ scheme, username: "", password: "", host: "", port: null, path: [], query: null, fragment: null }, rest, []);
  }
  if (isSpecial(scheme)) {
    if (base !== null && base.scheme === scheme && !/^[/\\]/.test(rest)) return relative(rest, base);
    return withAuthority(scheme, rest.replace(/^[/\\]+/, ""));
  }
  if (rest.startsWith("//")) return withAuthority(scheme, rest.slice(2));
  const url = { scheme, username: "", password: "", host: null, port: null, path: [], query: null, fragment: null };
  if (rest[0] === "/") return finish(url, rest, []);
  // An opaque path (mailto:, data:, urn:): kept as it is, C0-encoded, up to ? or #.
  const end = rest.search(/[?#]/);
  finish(url, end < 0 ? "" : rest.slice(end), []);
  url.path = percentEncode(end < 0 ? rest : rest.slice(0, end), C0_SET);
  return url;
}

const pathOf = (url) => {
  if (typeof url.path === "string") return url.path;
  const joined = url.path.length ? `/${url.path.join("/")}` : "";
  return url.host === null && url.path.length > 1 && url.path[0] === "" ? `/.${joined}` : joined;
};

function hostOf(url) {
  if (url.host === null) return "";
  return url.port === null ? url.host : `${url.host}:${url.port}`;
}

function serialize(url, withFragment = true) {
  let out = `${url.scheme}:`;
  if (url.host !== null) {
    out += "//";
    if (url.username !== "" || url.password !== "") out += `${url.username}${url.password !== "" ? `:${url.password}` : ""}@`;
    out += hostOf(url);
  }
  out += pathOf(url);
  if (url.query !== null) out += `?${url.query}`;
  if (withFragment && url.fragment !== null) out += `#${url.fragment}`;
  return out;
}

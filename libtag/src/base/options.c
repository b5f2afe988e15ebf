/* options.c - LIBTAG_* environment variables.
 *
 * Read once, at the first allocation, before anything else of libtag runs.
 * A value that does not parse is an error at start-up: one line on stderr
 * naming the variable and what it accepts, then the process exits 2.  A
 * mistyped option must not silently run a production service untraced.
 * No malloc: getenv() only reads environ. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/options.h"

struct tag_options _tag_opt = {
    .on_anomaly = TAG_ON_SNAPSHOT,
    .core_path = TAG_CORE_AUTO,
    .signal = SIGUSR2,
    .quiet = 0,
    .unwind = TAG_UNWIND_AUTO,
    .fp_depth = TAG_WALK_MAX,
    .stack_nodes = 1u << 24,  /* a cap: the table grows to it by use (stack_table.c) */
    .stack_stats = 1,
    .quarantine_bytes = 1u << 20,
    .quarantine_fill = TAG_QUARANTINE_DEFAULT_FILL,
    .sweep_every = 4096,
    .guard_rate = TAG_GUARD_DEFAULT_RATE,
    .guard_slots = 0,
    .guard_sites = TAG_GUARD_DEFAULT_SITES,
    .dir = "",
};

__attribute__((noreturn)) static void bad(const char *name, const char *value,
                                          const char *expected)
{
    _tag_log_always("libtag: error: %s=%s: expected %s", name, value, expected);
    _exit(2);
}

/* Parse a decimal number with an optional k/m/g suffix (powers of 1024). */
static uint64_t number(const char *name, const char *v, uint64_t lo, uint64_t hi)
{
    uint64_t n = 0;
    const char *p = v;
    if (*p < '0' || *p > '9')
        bad(name, v, "a number");
    for (; *p >= '0' && *p <= '9'; p++) {
        if (n > (UINT64_MAX - 9) / 10)
            bad(name, v, "a smaller number");
        n = n * 10 + (uint64_t)(*p - '0');
    }
    unsigned shift = 0;
    switch (*p) {
    case 'k': case 'K': shift = 10; p++; break;
    case 'm': case 'M': shift = 20; p++; break;
    case 'g': case 'G': shift = 30; p++; break;
    }
    if (*p != '\0')
        bad(name, v, "a number, optionally with a k, m or g suffix");
    if (shift && n > (UINT64_MAX >> shift))
        bad(name, v, "a smaller number");
    n <<= shift;
    if (n < lo || n > hi) {
        char what[96];
        _tag_format(what, sizeof what, "a number from %lu to %lu",
                    (unsigned long)lo, (unsigned long)hi);
        bad(name, v, what);
    }
    return n;
}

static int choice(const char *name, const char *v, const char *const *names,
                  int count, const char *expected)
{
    for (int i = 0; i < count; i++)
        if (strcmp(v, names[i]) == 0)
            return i;
    bad(name, v, expected);
}

static int signal_number(const char *name, const char *v)
{
    static const struct { const char *name; int sig; } table[] = {
        {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"PWR", SIGPWR},
        {"URG", SIGURG}, {"WINCH", SIGWINCH}, {"TTIN", SIGTTIN},
    };
    if (strcmp(v, "none") == 0 || strcmp(v, "0") == 0)
        return 0;
    if (v[0] >= '0' && v[0] <= '9')
        return (int)number(name, v, 1, 64);
    if (strncmp(v, "SIG", 3) == 0)
        v += 3;
    if (strncmp(v, "RTMIN+", 6) == 0)
        return SIGRTMIN + (int)number(name, v + 6, 0, 15);
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(v, table[i].name) == 0)
            return table[i].sig;
    bad(name, v, "a signal: USR1, USR2, PWR, URG, WINCH, TTIN, RTMIN+N, a number or none");
}

void _tag_options_init(void)
{
    static const char *const anomaly[] = {"snapshot", "abort", "ignore"};
    static const char *const core[] = {"auto", "kernel", "self"};
    static const char *const boolean[] = {"0", "1"};
    const char *v;

    /* Where lines go first, so that a bad value below is said there. */
    if ((v = getenv("LIBTAG_LOG"))) {
        size_t n = strlen(v);
        if (strcmp(v, "stderr") == 0)
            _tag_opt.log = TAG_LOG_STDERR;
        else if (strcmp(v, "off") == 0)
            _tag_opt.log = TAG_LOG_OFF;
        else if (v[0] == '/' && n < sizeof _tag_opt.log_path - 16) {
            _tag_opt.log = TAG_LOG_PATH;
            memcpy(_tag_opt.log_path, v, n + 1);
        } else
            bad("LIBTAG_LOG", v, "stderr, off, or an absolute path shorter than 496 bytes");
    }
    if ((v = getenv("LIBTAG_QUIET")))
        _tag_opt.quiet = choice("LIBTAG_QUIET", v, boolean, 2, "0 or 1");
    _tag_log_init();
    if ((v = getenv("LIBTAG_AT_EXIT"))) {
        static const char *const at_exit[] = {"none", "snapshot"};
        _tag_opt.at_exit = choice("LIBTAG_AT_EXIT", v, at_exit, 2, "none or snapshot");
    }
    if ((v = getenv("LIBTAG_STATS")))
        _tag_opt.stats = choice("LIBTAG_STATS", v, boolean, 2, "0 or 1");
    if ((v = getenv("LIBTAG_STACK_STATS")))
        _tag_opt.stack_stats = choice("LIBTAG_STACK_STATS", v, boolean, 2, "0 or 1");
    if ((v = getenv("LIBTAG_ON_ANOMALY")))
        _tag_opt.on_anomaly = choice("LIBTAG_ON_ANOMALY", v, anomaly, 3,
                                     "snapshot, abort or ignore");
    if ((v = getenv("LIBTAG_PAYLOAD"))) {
        static const char *const payload[] = {"keep", "omit"};
        _tag_opt.omit_payload = choice("LIBTAG_PAYLOAD", v, payload, 2, "keep or omit");
    }
    if ((v = getenv("LIBTAG_CORE")))
        _tag_opt.core_path = choice("LIBTAG_CORE", v, core, 3, "auto, kernel or self");
    if ((v = getenv("LIBTAG_SIGNAL")))
        _tag_opt.signal = signal_number("LIBTAG_SIGNAL", v);
    if ((v = getenv("LIBTAG_UNWIND"))) {
        static const char *const unwind[] = {"auto", "shadow", "fp", "cfi"};
        _tag_opt.unwind = choice("LIBTAG_UNWIND", v, unwind, 4, "auto, shadow, fp or cfi");
    }
    if ((v = getenv("LIBTAG_FP_DEPTH")))
        _tag_opt.fp_depth = (uint32_t)number("LIBTAG_FP_DEPTH", v, 1, TAG_WALK_MAX);
    if ((v = getenv("LIBTAG_STACK_NODES")))
        _tag_opt.stack_nodes = (uint32_t)number("LIBTAG_STACK_NODES", v, 1024, 1u << 28);
    if ((v = getenv("LIBTAG_QUARANTINE")))
        _tag_opt.quarantine_bytes = number("LIBTAG_QUARANTINE", v, 0, 1ull << 40);
    if ((v = getenv("LIBTAG_QUARANTINE_FILL")))
        _tag_opt.quarantine_fill = (uint32_t)number("LIBTAG_QUARANTINE_FILL", v, 0, 1u << 20);
    if ((v = getenv("LIBTAG_SWEEP")))
        _tag_opt.sweep_every = (uint32_t)number("LIBTAG_SWEEP", v, 0, 1u << 30);
    if ((v = getenv("LIBTAG_GUARD_RATE")))
        _tag_opt.guard_rate = (uint32_t)number("LIBTAG_GUARD_RATE", v, 0, 1u << 30);
    if ((v = getenv("LIBTAG_GUARD_SLOTS")))
        _tag_opt.guard_slots = (uint32_t)number("LIBTAG_GUARD_SLOTS", v, 1, TAG_GUARD_MAX_SLOTS);
    if ((v = getenv("LIBTAG_GUARD_SITES")))
        _tag_opt.guard_sites = (uint32_t)number("LIBTAG_GUARD_SITES", v, 0, 1u << 20);
    if ((v = getenv("LIBTAG_DIR"))) {
        size_t n = strlen(v);
        if (n == 0 || n >= sizeof _tag_opt.dir)
            bad("LIBTAG_DIR", v, "a directory path shorter than 512 bytes");
        if (v[0] != '/')
            bad("LIBTAG_DIR", v, "an absolute path");
        memcpy(_tag_opt.dir, v, n + 1);
    }
}

// rt_noise_cxx.cc - a C++ program whose biggest live block is libstdc++'s
// own: the emergency exception pool its static constructor allocates before
// main, beside a few small objects of the program's own.  It prints with
// write(2), never stdio, so stdout has no buffer.
//
//   rt_noise_cxx   print the facts, raise(SIGUSR2) (an on-demand snapshot
//                  into $LIBTAG_DIR), exit 0
//
// The facts (one per line): "own ADDR SIZE" for each object of the
// program's own (make_node <- main), then "pid PID".
#include <csignal>
#include <cstdio>
#include <cstring>
#include <unistd.h>

struct Node {
    char bytes[48];
};

static Node *g_own[3];

__attribute__((noinline)) static Node *make_node()
{
    Node *n = new Node;
    std::memset(n->bytes, 0x33, sizeof n->bytes);
    return n;
}

static void say(const char *line)
{
    if (write(1, line, std::strlen(line)) < 0)
        _exit(2);
}

int main()
{
    char line[64];
    for (auto &p : g_own)
        p = make_node();
    for (auto *p : g_own) {
        std::snprintf(line, sizeof line, "own %p %zu\n", static_cast<void *>(p), sizeof(Node));
        say(line);
    }
    std::snprintf(line, sizeof line, "pid %d\n", static_cast<int>(getpid()));
    say(line);
    std::raise(SIGUSR2);
    return 0;
}

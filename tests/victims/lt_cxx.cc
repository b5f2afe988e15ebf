// lt_cxx.cc - C++ new/delete reach libtag through libstdc++: every form of
// operator new hands out a tagged block and every delete frees it.
//
// Prints "no-libtag" without libtag.  Otherwise "<form> tag ..." lines (see
// lt_print_tag; for new[] of a type with a destructor the block starts at
// the array cookie, 8 bytes before the pointer new[] returns) and
// "<form> deleted ..." lines read from the quarantined block after delete.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <sys/resource.h>
#include <new>
#include <string>
#include <vector>

#include "lt_reader.c"

struct WithDtor {
    int v[5];
    ~WithDtor() { v[0] = 0; }
};

struct alignas(64) Aligned64 {
    char c[64];
};

/* The tag line, then "<label> kind=N": how libtag recorded the allocation
 * (enum libtag_alloc_kind). */
static void tagged(const char *label, const void *block)
{
    lt_print_tag(label, block);
    const struct libtag_tag *t = lt_tag(block);
    printf("%s kind=%u\n", label, t ? lt_kind(t) : 99u);
}

static void deleted(const char *label, const void *block)
{
    const struct libtag_tag *t = lt_tag(block);
    const struct libtag_free_rec *f = lt_free_rec(block);
    printf("%s deleted tag_ok=%d state=%u free_tid_self=%d\n", label, t != nullptr,
           t ? lt_state(t) : 0u, f ? f->free_tid == lt_gettid() : 0);
}

/* A new_handler that gives the reserve back once, as C++ programs do to
 * survive a failed new. */
static void *reserve;
static int handler_calls;
static void give_back()
{
    handler_calls++;
    free(reserve);
    reserve = nullptr;
    std::set_new_handler(nullptr);
}

static size_t vm_data()
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmData: %zu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib * 1024;
}

static size_t opaque(size_t x)
{
    __asm__("" : "+r"(x));
    return x;
}

int main()
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (!lt_ctl()) {
        printf("no-libtag\n");
        return 0;
    }
    printf("libtag\n");   /* allocates stdout's buffer before the counters */
    struct libtag_stats s0, s1;
    libtag_stats(&s0);

    int *i = new int(42);
    tagged("new", i);
    delete i;
    deleted("new", i);

    char *a = new char[100];
    tagged("new[]", a);
    delete[] a;
    deleted("new[]", a);

    WithDtor *w = new WithDtor[3];
    const char *cookie = reinterpret_cast<const char *>(w) - sizeof(size_t);
    tagged("new[]cookie", cookie);
    delete[] w;
    deleted("new[]cookie", cookie);

    Aligned64 *al = new Aligned64;
    tagged("new-aligned", al);
    printf("new-aligned aligned=%d\n", reinterpret_cast<uintptr_t>(al) % 64 == 0);
    delete al;
    deleted("new-aligned", al);

    Aligned64 *ala = new Aligned64[3];
    tagged("new[]-aligned", ala);
    printf("new[]-aligned aligned=%d\n", reinterpret_cast<uintptr_t>(ala) % 64 == 0);
    delete[] ala;
    deleted("new[]-aligned", ala);

    void *raw = ::operator new(100, std::align_val_t(256));
    tagged("operator-new-align256", raw);
    printf("operator-new-align256 aligned=%d\n", reinterpret_cast<uintptr_t>(raw) % 256 == 0);
    ::operator delete(raw, std::align_val_t(256));
    deleted("operator-new-align256", raw);

    char *nt = new (std::nothrow) char[50];
    tagged("new-nothrow", nt);
    delete[] nt;
    deleted("new-nothrow", nt);

    Aligned64 *ntal = new (std::nothrow) Aligned64;
    tagged("new-nothrow-aligned", ntal);
    delete ntal;
    deleted("new-nothrow-aligned", ntal);

    // Containers: the block behind a vector's data is exactly its capacity.
    std::vector<int> v;
    for (int k = 0; k < 1000; k++)
        v.push_back(k);
    const struct libtag_tag *vt = lt_tag(v.data());
    printf("vector tag_ok=%d size_is_capacity=%d\n", vt != nullptr,
           vt ? lt_size(vt) == v.capacity() * sizeof(int) : 0);
    std::string s(200, 'x');
    const struct libtag_tag *st = lt_tag(s.data());
    printf("string tag_ok=%d size=%llu\n", st != nullptr,
           st ? (unsigned long long)lt_size(st) : 0ull);
    v.clear();
    v.shrink_to_fit();
    s.clear();
    s.shrink_to_fit();

    libtag_stats(&s1);
    printf("stats live_blocks=%lld anomalies=%u\n",
           (long long)(s1.live_blocks - s0.live_blocks), s1.anomalies);
    // Failure (after the counters: the first throw leaves the unwinder's
    // caches allocated): nothrow gives nullptr, plain new throws std::bad_alloc.
    char *none = new (std::nothrow) char[opaque(SIZE_MAX / 2)];
    printf("new-nothrow-huge null=%d\n", none == nullptr);
    try {
        char *huge = new char[opaque((size_t)1 << 48)];
        printf("new-huge returned %p\n", static_cast<void *>(huge));
    } catch (const std::bad_alloc &) {
        printf("new-huge bad_alloc\n");
    }
    try {
        void *huge = ::operator new(opaque(SIZE_MAX / 2), std::align_val_t(64));
        printf("new-aligned-huge returned %p\n", huge);
    } catch (const std::bad_alloc &) {
        printf("new-aligned-huge bad_alloc\n");
    }

    // A new that fails until its new_handler frees memory: the retry runs
    // in libstdc++'s operator new, over libtag's malloc, and the block it
    // returns is still a new[] block (delete[] of it is no mismatch).
    // With the 40 MiB reserve held, the writable memory (RLIMIT_DATA: what
    // glibc's mmap and libtag's heap commits both count against) is capped
    // 24 MiB above what is used: the new fails until the handler frees the
    // reserve (above the quarantine budget, so free() hands it straight
    // back).  Not RLIMIT_AS: libtag's heap reserved its address space at
    // start, so a cap set later does not limit it.
    const size_t big = (size_t)40 << 20;
    reserve = malloc(big);
    struct rlimit data;
    getrlimit(RLIMIT_DATA, &data);
    data.rlim_cur = vm_data() + ((size_t)24 << 20);
    setrlimit(RLIMIT_DATA, &data);
    std::set_new_handler(give_back);
    char *retried = new char[opaque(big)];
    tagged("new[]-after-handler", retried);
    printf("new[]-after-handler handler_calls=%d\n", handler_calls);
    delete[] retried;
    libtag_stats(&s1);
    printf("new[]-after-handler anomalies=%u\n", s1.anomalies);

    return 0;
}

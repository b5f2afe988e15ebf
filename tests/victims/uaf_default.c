/* uaf_default.c - reads after free that libtag's DEFAULT settings must
 * catch at the instruction (no LIBTAG_GUARD_RATE in the environment): the
 * freed block comes from an allocation site that allocates once, so it is
 * one of its site's first allocations (LIBTAG_GUARD_SITES).
 *
 *   uaf_default CASE
 *
 * Before either case, 200000 blocks of 48 bytes are allocated and freed from
 * one hot site (churn), so the read is not the program's first allocation.
 *
 * Cases:
 *   addrinfo  getaddrinfo("127.0.0.1", "80", AI_NUMERICHOST, SOCK_STREAM: no
 *             network, one result), freeaddrinfo, then read res->ai_family
 *             in read_family()
 *   config    a struct config allocated once (load_config), freed at a
 *             "reload", then its port read in read_port()
 *
 * Before the read it prints block=0x... (the freed block: glibc allocates
 * an addrinfo and its sockaddr as one block, starting at the addrinfo),
 * size=N (its bytes: sizeof(struct addrinfo) + ai_addrlen, or sizeof(struct
 * config)), address=0x... (the byte read) and line=N (the source line of
 * the read); after it value=N (what the read returned) and "survived".
 */
#define _GNU_SOURCE
#include <netdb.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct config {
    char name[56];
    int port;
    int workers;
    double timeout;
    char *root;
};

static const int family_line = __LINE__ + 3;
__attribute__((noinline)) static int read_family(const struct addrinfo *r)
{
    return r->ai_family;
}

static const int port_line = __LINE__ + 3;
__attribute__((noinline)) static int read_port(const struct config *c)
{
    return c->port;
}

__attribute__((noinline)) static struct config *load_config(void)
{
    struct config *c = calloc(1, sizeof *c);
    if (!c)
        exit(3);
    strcpy(c->name, "uaf_default");
    c->port = 8080;
    c->workers = 4;
    c->timeout = 2.5;
    return c;
}

__attribute__((noinline)) static void churn(void)
{
    for (int i = 0; i < 200000; i++) {
        char *volatile p = malloc(48);
        if (!p)
            exit(3);
        p[0] = (char)i;
        free(p);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    churn();
    int value;
    if (!strcmp(argv[1], "addrinfo")) {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICHOST;
        int rc = getaddrinfo("127.0.0.1", "80", &hints, &res);
        if (rc != 0 || !res || res->ai_next) {
            printf("getaddrinfo=%d\n", rc);
            return 3;
        }
        printf("block=%p size=%zu address=%p line=%d\n", (void *)res,
               sizeof(struct addrinfo) + (size_t)res->ai_addrlen, (void *)&res->ai_family,
               family_line);
        freeaddrinfo(res);
        value = read_family(res);
    } else if (!strcmp(argv[1], "config")) {
        struct config *c = load_config();
        printf("block=%p size=%zu address=%p line=%d\n", (void *)c, sizeof *c,
               (void *)&c->port, port_line);
        free(c);  /* the "reload" */
        value = read_port(c);
    } else {
        return 2;
    }
    printf("value=%d\n", value);
    printf("survived\n");
    return 0;
}

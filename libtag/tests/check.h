/* check.h - the one assertion of libtag's C unit tests: CHECK(c) counts
 * itself (atomically: test_stack_table checks from several threads) and,
 * when c is false, names the file, the line and the expression, and exits 1
 * (ctest's failure). */
#ifndef LIBTAG_TESTS_CHECK_H
#define LIBTAG_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int checks;

#define CHECK(c)                                                              \
    do {                                                                      \
        __atomic_fetch_add(&checks, 1, __ATOMIC_RELAXED);                     \
        if (!(c)) {                                                           \
            fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #c);   \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

#endif

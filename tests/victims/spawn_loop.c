/* Threads created and joined without pause, for snapshots by ptrace taken
 * while a thread is inside clone (forensics/snapshots/ptrace.py must let it
 * finish its clone before it injects anything).
 *
 *   spawn_loop
 *
 * The main thread (the one a snapshot injects its clone into) creates and
 * joins a thread that increments a counter, over and over; a second thread
 * takes the commands.  Prints "ready"; on stdin "report" prints
 * "report spawned=N ran=M errors=E" (pthread_create/join failures), "quit"
 * exits 0 after checking that every created thread ran exactly once.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static atomic_long spawned, ran, errors;
static atomic_int stop;

static void *child_main(void *arg)
{
    (void)arg;
    atomic_fetch_add(&ran, 1);
    return NULL;
}

static void *commands_main(void *arg)
{
    (void)arg;
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "report", 6) == 0) {
            printf("report spawned=%ld ran=%ld errors=%ld\n", atomic_load(&spawned),
                   atomic_load(&ran), atomic_load(&errors));
            fflush(stdout);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        }
    }
    atomic_store(&stop, 1);
    return NULL;
}

int main(void)
{
    pthread_t c;
    pthread_create(&c, NULL, commands_main, NULL);
    while (!atomic_load(&stop)) {
        pthread_t t;
        if (pthread_create(&t, NULL, child_main, NULL) != 0) {
            atomic_fetch_add(&errors, 1);
            continue;
        }
        atomic_fetch_add(&spawned, 1);
        if (pthread_join(t, NULL) != 0)
            atomic_fetch_add(&errors, 1);
    }
    pthread_join(c, NULL);
    return atomic_load(&spawned) == atomic_load(&ran) && atomic_load(&errors) == 0 ? 0 : 3;
}

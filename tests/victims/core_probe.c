/* core_probe: a live process whose memory a core reader can check exactly.
 *
 * Prints, one per line, then blocks reading stdin until EOF (or a signal):
 *   pid PID
 *   tid TID          (three lines: main thread first, then the two workers)
 *   global ADDR LEN  (a global array)
 *   heap ADDR LEN    (a malloc'ed buffer)
 *   stack ADDR LEN   (an array in main's frame)
 *   ready
 * Byte i of each buffer is pattern(seed, pid, i) below; the test computes the
 * same bytes itself, so a core of any other process (or run) cannot match.
 * Seeds: global 1, heap 2, stack 3.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define GLOBAL_LEN 64
#define HEAP_LEN 4096
#define STACK_LEN 48
#define WORKERS 2

unsigned char probe_global[GLOBAL_LEN];

static pthread_barrier_t started;
static pid_t worker_tids[WORKERS];

static unsigned char pattern(unsigned seed, unsigned pid, unsigned i)
{
	return (unsigned char)((seed * 67u + pid * 13u + i * 151u + (i >> 8)) & 0xffu);
}

static void fill(volatile unsigned char *buf, size_t len, unsigned seed)
{
	unsigned pid = (unsigned)getpid();
	for (size_t i = 0; i < len; i++)
		buf[i] = pattern(seed, pid, (unsigned)i);
}

static void *worker(void *arg)
{
	worker_tids[(long)arg] = gettid();
	pthread_barrier_wait(&started);
	for (;;)
		pause(); /* park until the process dies */
	return NULL;
}

int main(void)
{
	volatile unsigned char stack_buf[STACK_LEN];
	unsigned char *heap = malloc(HEAP_LEN);
	pthread_t threads[WORKERS];
	char line[64];

	if (heap == NULL)
		return 1;
	fill(probe_global, GLOBAL_LEN, 1);
	fill(heap, HEAP_LEN, 2);
	fill(stack_buf, STACK_LEN, 3);

	pthread_barrier_init(&started, NULL, WORKERS + 1);
	for (long i = 0; i < WORKERS; i++)
		if (pthread_create(&threads[i], NULL, worker, (void *)i) != 0)
			return 1;
	pthread_barrier_wait(&started);

	printf("pid %d\n", (int)getpid());
	printf("tid %d\n", (int)gettid());
	for (int i = 0; i < WORKERS; i++)
		printf("tid %d\n", (int)worker_tids[i]);
	printf("global %p %d\n", (void *)probe_global, GLOBAL_LEN);
	printf("heap %p %d\n", (void *)heap, HEAP_LEN);
	printf("stack %p %d\n", (void *)stack_buf, STACK_LEN);
	printf("ready\n");
	fflush(stdout);

	while (fgets(line, sizeof line, stdin) != NULL)
		; /* wait for EOF: the test closes stdin when it is done */
	/* Keep the buffers live up to here so nothing is optimised away. */
	return stack_buf[0] + heap[0] + probe_global[0] == 0x1000;
}

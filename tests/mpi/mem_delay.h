/*
 * A memory-table row for tests only (collectives/mem.h): host memory whose operations run on a
 * worker thread per queue, in order, each after a seeded random delay, so that a fence the
 * runtime forgets shows up as a wrong result. It is staged (DEAR_MEM_F_STAGE), as device memory
 * behind host collectives is: every bucket is packed and unpacked through its queue.
 *   MEM_DELAY_US    the longest delay before an operation (default 300 us)
 *   MEM_DELAY_SEED  the seed of the delays (default 1)
 */
#ifndef DEAR_TEST_MEM_DELAY_H
#define DEAR_TEST_MEM_DELAY_H

#include "collectives/mem.h"

extern const dear_mem_ops_t mem_delay_ops;

/* Make it the row of host gradients for every context made from now on (runtime/mem.c), and
 * read the environment. */
void mem_delay_install(void);

#endif

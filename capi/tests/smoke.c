/* Records a small training-like run through the C ABI: a link and a function scope, pool
 * allocations with a caller-given stack, an epoch, a call that fails; meanwhile a second
 * recording with a pool of its own. Exits non-zero, naming the call, on any failure.
 * Usage: smoke TRACE_PATH SECOND_TRACE_PATH */
#include <stdio.h>
#include <string.h>

#include "poolsight.h"

#define CHECK(cond, what)                                                   \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "smoke: %s failed: %s\n", what, ps_last_error());     \
      return 1;                                                             \
    }                                                                       \
  } while (0)

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: smoke TRACE SECOND_TRACE\n");
    return 2;
  }
  PsConfig config;
  ps_config_default(&config);
  config.rank = 0;
  config.world_size = 1;
  PsRecorder *rec = ps_recorder_create(argv[1], &config);
  CHECK(rec != NULL, "ps_recorder_create");

  /* Bad input is refused with a reason, never a crash. */
  CHECK(ps_recorder_create(NULL, NULL) == NULL, "ps_recorder_create(NULL) refusal");
  CHECK(strstr(ps_last_error(), "path is NULL") != NULL, "the NULL path message");
  PsScopeToken bad;
  CHECK(ps_scope_enter(rec, 99, "x", PS_PHASE_NONE, NULL, 0, &bad) == -1, "bad kind refusal");

  /* One recording per file: a second one on the same path is refused, naming this process. */
  CHECK(ps_recorder_create(argv[1], NULL) == NULL, "a second recording of the same file");
  CHECK(strstr(ps_last_error(), "is being recorded by this process") != NULL,
        "the busy file's message");

  PsPool *pool = ps_pool_create_host(rec, 0, 1 << 20);
  CHECK(pool != NULL, "ps_pool_create_host");

  /* A second recording with its own pool, at the same time: each trace gets its own pool's
   * events only. */
  PsRecorder *other = ps_recorder_create(argv[2], NULL);
  CHECK(other != NULL, "ps_recorder_create(second)");
  PsPool *other_pool = ps_pool_create_host(other, 0, 1 << 20);
  CHECK(other_pool != NULL, "ps_pool_create_host(second)");
  uint64_t o = ps_pool_malloc(other_pool, 4096, 0, 0);
  CHECK(o != 0, "ps_pool_malloc(second)");

  CHECK(ps_epoch_begin(rec, 1, 0) == 0, "ps_epoch_begin");
  PsScopeToken link, fn;
  CHECK(ps_scope_enter(rec, PS_SCOPE_LINK, "Linear", PS_PHASE_NONE, "model.c", 10, &link) == 0,
        "ps_scope_enter(link)");
  CHECK(ps_scope_enter(rec, PS_SCOPE_FUNCTION, "LinearFunction", PS_PHASE_FORWARD, "model.c", 11,
                       &fn) == 0,
        "ps_scope_enter(function)");

  /* One allocation with the open scopes as its stack, one with a frame of our own. */
  uint64_t a = ps_pool_malloc(pool, 1000, 0, 0);
  CHECK(a != 0, "ps_pool_malloc(1000)");
  uint32_t here = ps_stack_push(rec, ps_stack_current(rec), "model.c", 42, "forward");
  CHECK(here != 0, "ps_stack_push");
  uint64_t b = ps_pool_malloc(pool, 2000, 0, here);
  CHECK(b != 0, "ps_pool_malloc(2000)");
  CHECK(ps_pool_used_bytes(pool) == 1024 + 2048, "ps_pool_used_bytes");
  CHECK(ps_pool_free(pool, a) == 0, "ps_pool_free(a)");
  CHECK(ps_pool_free(pool, a) == -1, "double free refusal");
  CHECK(ps_pool_free(pool, b) == 0, "ps_pool_free(b)");

  /* Out of memory is an error value, not an abort. */
  CHECK(ps_pool_malloc(pool, 1u << 30, 0, 0) == 0, "oversized malloc refusal");
  CHECK(strstr(ps_last_error(), "out of memory") != NULL, "the out-of-memory message");

  CHECK(ps_scope_exit(rec, fn) == 0, "ps_scope_exit(function)");
  CHECK(ps_scope_exit(rec, fn) == -1, "a second exit is refused");

  /* A call that fails: not a call of LinearFunction (no occurrence, no bytes of its row). */
  PsScopeToken failing;
  CHECK(ps_scope_enter(rec, PS_SCOPE_FUNCTION, "LinearFunction", PS_PHASE_FORWARD, "model.c", 11,
                       &failing) == 0,
        "ps_scope_enter(failing)");
  uint64_t c = ps_pool_malloc(pool, 8192, 0, 0);
  CHECK(c != 0, "ps_pool_malloc(8192)");
  CHECK(ps_pool_free(pool, c) == 0, "ps_pool_free(c)");
  CHECK(ps_scope_abort(rec, failing) == 0, "ps_scope_abort");
  CHECK(ps_scope_abort(rec, failing) == -1, "a second close is refused");
  CHECK(ps_scope_exit(rec, link) == 0, "ps_scope_exit(link)");
  CHECK(ps_epoch_end(rec, 1, 0, 0) == 0, "ps_epoch_end");
  CHECK(ps_recorder_dropped_events(rec) == 0, "no dropped events");
  ps_pool_destroy(pool);
  CHECK(ps_recorder_finish(rec) == 0, "ps_recorder_finish");
  CHECK(ps_pool_free(other_pool, o) == 0, "ps_pool_free(second)");
  ps_pool_destroy(other_pool);
  CHECK(ps_recorder_finish(other) == 0, "ps_recorder_finish(second)");
  return 0;
}

// pk_pool.h — the native kernels' own worker threads: pk::parallel_for(tasks, threads, fn).
//
// Why not OpenMP: the kernels share the libgomp torch loads, whose idle threads spin for a long
// time (GOMP_SPINCOUNT, read once at `import torch`), so on a machine where other processes want
// the cores a spinning thread holds the core its partner needs and a 2-thread call runs many times
// slower than a 1-thread one (docs/cpu-backend.md, "OpenMP's waiting policy"). These workers spin
// briefly (about kSpinRounds pauses) after a call, then sleep on a futex; every call hands out tasks
// one at a time to whoever is running (the caller included), so a descheduled worker delays only
// the task it holds, and the caller never waits on a worker that has not started one.
//
// Protocol: a call publishes (fn, ctx, participants) in the pool record, then a 64-bit ticket
// (generation | next task | task count). A worker claims task `next` by a compare-exchange of the
// ticket it read, then reads the record: the claimed task is unfinished, so the call owning the
// ticket is still running and the record is its own (a new call rewrites the record only after
// every task of the previous one finished). The caller returns once `done` reaches the count; a
// late worker can only fail its compare-exchange, so nothing of a finished call is touched. One
// call runs at a time per library; a concurrent call (another Python thread) runs serially on its
// own thread instead of waiting.
// After fork() the child starts with no workers (pthread_atfork resets the pool).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#if defined(__linux__)
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#define PK_POOL 1
#endif

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pk {

#if defined(PK_POOL)
// Internal linkage: each library (one translation unit) has its own pool and workers, so builds of
// different versions of this header loaded in one process never share state.
namespace {
namespace pool_detail {

constexpr int kMaxWorkers = 255;
constexpr int kSpinRounds = 4096;       // pauses before a worker sleeps (tens of microseconds)
// ticket fields: generation (20 bits) | next task (22) | task count (22); longer loops are cut into
// at most kMaxTasks tasks of consecutive indices
constexpr int kCountBits = 22;
constexpr int64_t kMaxTasks = int64_t(1) << kCountBits;
constexpr uint64_t kField = uint64_t(kMaxTasks) - 1;
inline uint64_t gen_of(uint64_t t) { return t >> (2 * kCountBits); }
inline int64_t next_of(uint64_t t) { return int64_t((t >> kCountBits) & kField); }
inline int64_t count_of(uint64_t t) { return int64_t(t & kField); }

inline void relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

struct Pool {
  std::atomic<uint64_t> ticket{0};  // generation | next task | task count
  std::atomic<int64_t> done{0};     // tasks finished in the current call
  std::atomic<uint32_t> wake{0};    // futex word, bumped by every call
  std::atomic<int> busy{0};         // a call is running
  std::atomic<int> started{0};      // workers created
  std::atomic<int> sleepers{0};     // workers in (or entering) futex_wait
  // the current call (read by workers, validated by their ticket exchange)
  std::atomic<void (*)(void*, int64_t)> fn{nullptr};
  std::atomic<void*> ctx{nullptr};
  std::atomic<int> helpers{0};  // workers 0 .. helpers-1 take part
};

inline Pool& pool() {
  static Pool p;
  return p;
}

inline void futex_wait(std::atomic<uint32_t>* word, uint32_t seen) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, kMaxWorkers, nullptr, nullptr, 0);
}

// Claims and runs tasks of the call whose ticket generation is `gen` until none is left.
inline void work(Pool& p, uint64_t gen) {
  uint64_t t = p.ticket.load();
  while (gen_of(t) == gen && next_of(t) < count_of(t)) {
    if (!p.ticket.compare_exchange_weak(t, t + (uint64_t(1) << kCountBits))) continue;  // t reloaded
    // the claimed task is unfinished, so the call that owns the ticket is still running and the
    // record is that call's (read after the claim: even a wrapped generation cannot mislead it)
    auto* fn = p.fn.load();
    void* ctx = p.ctx.load();
    fn(ctx, next_of(t));
    p.done.fetch_add(1);
    t = p.ticket.load();
  }
}

inline void* worker_main(void* arg) {
  Pool& p = pool();
  const int me = static_cast<int>(reinterpret_cast<intptr_t>(arg));
  uint32_t seen = p.wake.load();
  for (;;) {
    int spins = 0;
    while (p.wake.load() == seen) {
      if (++spins < kSpinRounds) {
        relax();
      } else {
        p.sleepers.fetch_add(1);
        futex_wait(&p.wake, seen);  // returns at once if wake moved on since `seen`
        p.sleepers.fetch_sub(1);
        spins = 0;
      }
    }
    seen = p.wake.load();
    const uint64_t t = p.ticket.load();
    if (me < p.helpers.load()) work(p, gen_of(t));
  }
  return nullptr;
}

inline void after_fork_in_child() {
  Pool& p = pool();
  p.started.store(0);  // the workers did not survive the fork
  p.sleepers.store(0);
  p.busy.store(0);
}

// Starts workers until `count` exist (or creation fails); returns how many exist.
inline int ensure_workers(int count) {
  Pool& p = pool();
  static std::atomic<int> hooked{0};
  if (hooked.exchange(1) == 0) pthread_atfork(nullptr, nullptr, after_fork_in_child);
  int have = p.started.load();
  while (have < count && have < kMaxWorkers) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t th;
    const bool ok = pthread_create(&th, &attr, worker_main, reinterpret_cast<void*>(intptr_t(have))) == 0;
    pthread_attr_destroy(&attr);
    if (!ok) break;
    pthread_setname_np(th, "pk-worker");  // what top -H and the tests see
    p.started.store(++have);
  }
  return have;
}

template <class F>
void trampoline(void* ctx, int64_t task) {
  (*static_cast<F*>(ctx))(task);
}

}  // namespace pool_detail
}  // namespace
#endif

// Runs fn(task) for task in [0, tasks) on up to `threads` threads (the caller is one of them), in
// no fixed order and with no barrier between tasks; returns when every task has finished. fn must
// not throw. threads <= 1, one task, or another call still running: the caller runs every task
// itself, in order. (Without Linux futexes: an OpenMP loop.)
template <class F>
void parallel_for(int64_t tasks, int threads, F&& fn) {
#if defined(PK_POOL)
  using namespace pool_detail;
  Pool& p = pool();
  int idle = 0;
  if (threads > 1 && tasks > 1 && p.busy.compare_exchange_strong(idle, 1)) {
    const int64_t per = (tasks + kMaxTasks - 1) / kMaxTasks;  // indices per task (1 unless huge)
    const int64_t count = (tasks + per - 1) / per;
    auto run = [&](int64_t t) {
      for (int64_t i = t * per, e = std::min(tasks, i + per); i < e; ++i) fn(i);
    };
    const int helpers = std::min<int64_t>(ensure_workers(threads - 1), std::min<int64_t>(threads - 1, count - 1));
    p.done.store(0);
    p.fn.store(&trampoline<decltype(run)>);
    p.ctx.store(static_cast<void*>(&run));
    p.helpers.store(helpers);
    const uint64_t gen = (gen_of(p.ticket.load()) + 1) & ((uint64_t(1) << (64 - 2 * kCountBits)) - 1);
    p.ticket.store((gen << (2 * kCountBits)) | uint64_t(count));
    p.wake.fetch_add(1);
    if (p.sleepers.load() > 0) futex_wake_all(&p.wake);
    work(p, gen);
    for (int spins = 0; p.done.load() < count;) {
      if (++spins < kSpinRounds) {
        relax();
      } else {
        sched_yield();  // a worker holding a task may need this core
      }
    }
    p.busy.store(0);
    return;
  }
  for (int64_t t = 0; t < tasks; ++t) fn(t);
#elif defined(_OPENMP)  // no futex here: OpenMP's dynamic schedule instead
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1 && tasks > 1)
  for (int64_t t = 0; t < tasks; ++t) fn(t);
#else
  (void)threads;
  for (int64_t t = 0; t < tasks; ++t) fn(t);
#endif
}

// parallel_for over about 4 blocks per thread of consecutive indices: fn(begin, end) for each
// block, so per-block setup (scratch buffers) is paid a few times per call, not once per index.
template <class F>
void parallel_blocks(int64_t n, int threads, F&& fn) {
  if (n <= 0) return;
  const int64_t blocks = threads > 1 ? std::min<int64_t>(n, int64_t(4) * threads) : 1;
  const int64_t per = (n + blocks - 1) / blocks;
  parallel_for((n + per - 1) / per, threads, [&](int64_t t) { fn(t * per, std::min(n, (t + 1) * per)); });
}

// parallel_blocks whose fn(begin, end) returns a count (e.g. refused blocks): the sum over blocks.
template <class F>
int64_t parallel_blocks_sum(int64_t n, int threads, F&& fn) {
  std::atomic<int64_t> sum{0};
  parallel_blocks(n, threads, [&](int64_t begin, int64_t end) {
    const int64_t part = fn(begin, end);
    if (part) sum += part;
  });
  return sum.load();
}

}  // namespace pk

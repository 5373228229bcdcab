#pragma once
// A fixed pool of worker threads for the CPU forward pass: `parallel_for` splits an index range into
// contiguous pieces and runs them on the workers and the calling thread, returning when all are done.
// The one place in the CPU backend with mutexes: the forward pass is data-parallel inside each op and
// needs a fork/join barrier, which a mailbox cannot give; callers on several threads (the stages of a
// pipeline, each on its own actor) take turns.
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry::model {

class ThreadPool {
 public:
  // threads == 0: one per hardware thread. The calling thread counts as one of them.
  explicit ThreadPool(unsigned threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // Calls fn(begin, end) over pieces covering [0, n), each at least `grain` long (except the last).
  // Runs inline when one piece suffices. Not reentrant: fn must not call parallel_for on this pool.
  // Callers on other threads wait for the running job to finish.
  // The first exception thrown by fn is rethrown here after every piece has finished.
  void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

 private:
  void worker_loop();
  void run_pieces();

  std::vector<std::thread> workers_;
  std::mutex caller_mu_;  // held by the thread whose job runs
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t n_ = 0, piece_ = 0, pieces_ = 0;
  size_t next_ = 0;        // next piece to hand out
  size_t finished_ = 0;    // pieces done
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace ferry::model

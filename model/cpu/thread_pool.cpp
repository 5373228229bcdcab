#include "model/cpu/thread_pool.hpp"

#include <algorithm>
#include <exception>

namespace ferry::model {

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(threads - 1);
  for (unsigned i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

// Takes pieces until none is left; every thread (workers and the caller) runs this.
void ThreadPool::run_pieces() {
  for (;;) {
    size_t piece;
    const std::function<void(size_t, size_t)>* job;
    {
      std::lock_guard lock(mu_);
      if (job_ == nullptr || next_ >= pieces_) return;
      piece = next_++;
      job = job_;
    }
    const size_t begin = piece * piece_;
    const size_t end = std::min(n_, begin + piece_);
    std::exception_ptr err;
    try {
      (*job)(begin, end);
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard lock(mu_);
    if (err && !error_) error_ = err;
    if (++finished_ == pieces_) done_.notify_all();
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_pieces();
  }
}

void ThreadPool::parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t max_pieces = std::max<size_t>(1, (n + grain - 1) / grain);
  // A few pieces per thread balance uneven work without much locking.
  const size_t pieces = std::min(max_pieces, size_t{size()} * 4);
  if (pieces <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  // Stages of a pipeline share the pool from their own threads: their jobs take turns.
  std::lock_guard turn(caller_mu_);
  {
    std::lock_guard lock(mu_);
    job_ = &fn;
    n_ = n;
    piece_ = (n + pieces - 1) / pieces;
    pieces_ = (n + piece_ - 1) / piece_;
    next_ = 0;
    finished_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  run_pieces();
  std::exception_ptr err;
  {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return finished_ == pieces_; });
    job_ = nullptr;
    err = error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace ferry::model

#pragma once
// The hand-off between two CUDA stages: the sender's output rows (the mHC streams) go into the
// receiver's inbox by a device-to-device copy on the sender's copy stream (on its compute stream when
// both stages share a device), peer-to-peer where the devices allow it, else staged by the driver
// through host memory, fenced by an event the receiver's compute stream waits on. The receiver copies
// the inbox into its own workspace at the start of its step and records that the inbox is free again.
// No host synchronisation inside a step: the only host wait is the sender's, before reusing the inbox,
// for the receiver to have *enqueued* the previous copy-out (else its "free" event would still be an
// older recording); a full pipeline waits there.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "gpu/cuda_memory.hpp"
#include "model/stage.hpp"

namespace ferry::gpu {

// What the sender hands on with the step's message: which delivery into the inbox carries its rows.
class CudaHandoff final : public model::Handoff {
 public:
  CudaHandoff(uint64_t sequence, uint32_t rows, uint64_t bytes) : sequence_(sequence), rows_(rows), bytes_(bytes) {}
  uint64_t sequence() const { return sequence_; }
  uint32_t rows() const override { return rows_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  uint64_t sequence_;
  uint32_t rows_;
  uint64_t bytes_;
};

// One link of the pipeline: an inbox on the receiver's device and the events of both sides.
class HandoffLink {
 public:
  // Makes the inbox (`bytes`) on `receiver`; enables peer access between the devices where possible.
  HandoffLink(int sender, int receiver, uint64_t bytes);

  // Sender, on its own thread with its device current: copy `bytes` from `src` into the inbox on
  // `stream` (which must already wait for whatever wrote `src`). Returns what the receiver gets.
  CudaHandoff send(const void* src, uint64_t bytes, uint32_t rows, cudaStream_t stream);
  // Receiver, with its device current: on `compute_stream`, wait for delivery `h`, copy it to `dst`
  // and mark the inbox free. Throws CudaError (internal) when `h` is not the next delivery.
  void receive(const CudaHandoff& h, void* dst, cudaStream_t compute_stream);
  // Receiver that will not read delivery `h` (a failed stage): counts it taken, so the sender never
  // waits for it.
  void discard(const CudaHandoff& h);

  // "peer-to-peer", "same device", or "through host memory (no peer access)".
  const std::string& path() const { return path_; }
  int sender() const { return sender_; }
  int receiver() const { return receiver_; }
  uint64_t capacity() const { return inbox_.bytes(); }

 private:
  int sender_, receiver_;
  std::string path_;
  DeviceBuffer inbox_;
  std::optional<Event> delivered_;  // on the sender's device: recorded after each copy into the inbox
  std::optional<Event> freed_;      // on the receiver's device: recorded after each copy out of it
  uint64_t sent_ = 0;                 // deliveries made (sender's thread only)
  std::atomic<uint64_t> received_{0};  // copy-outs enqueued by the receiver
};

// Whether device `a` can read device `b`'s memory directly (cudaDeviceCanAccessPeer).
bool can_access_peer(int a, int b);

}  // namespace ferry::gpu

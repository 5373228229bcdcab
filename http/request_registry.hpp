#pragma once
// Which generation requests exist and which API key made each: so that cancelling an unknown id
// answers 404, a late cancel of one that just ended is still the no-op it should be (STYLE rule 9),
// and with several keys only the key that made a request may cancel it.
//
// RequestIndex is the policy, a plain class; RequestRegistry runs one on an Asio strand (STYLE rule
// 11): the router adds a request before its bridge starts, the bridge's exit removes it, and a
// cancel looks it up, from whatever thread each of them runs on.
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/strand.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <unordered_map>

#include "http/auth.hpp"

namespace ferry::http {

using RequestNumber = uint64_t;  // actors::RequestId: the number in "chatcmpl-N"

// A request number no one can guess or count on: 53 random bits (exact in a JavaScript number),
// never 0, from the kernel's random source.
RequestNumber random_request_number();

class RequestIndex {
 public:
  enum class Found { live, ended, unknown };
  explicit RequestIndex(size_t remembered_ended = 4096) : remembered_(remembered_ended) {}

  void add(RequestNumber id, KeyIndex owner);
  // Ended: forgotten as live, remembered as ended (the last `remembered_ended` of them).
  void end(RequestNumber id);
  // What `caller` may learn of `id`. A request of another key is `unknown` to it unless `any_owner`
  // (a server with at most one key: every caller is the same client).
  Found find(RequestNumber id, KeyIndex caller, bool any_owner) const;
  size_t live() const { return live_.size(); }

 private:
  std::unordered_map<RequestNumber, KeyIndex> live_;
  std::unordered_map<RequestNumber, KeyIndex> ended_;
  std::deque<RequestNumber> ended_order_;
  size_t remembered_;
};

class RequestRegistry {
 public:
  explicit RequestRegistry(boost::asio::any_io_executor executor) : strand_(boost::asio::make_strand(executor)) {}

  void add(RequestNumber id, KeyIndex owner);
  void end(RequestNumber id);
  // Calls `done` on the registry's strand (it must not block).
  void find(RequestNumber id, KeyIndex caller, bool any_owner, std::function<void(RequestIndex::Found)> done);

 private:
  boost::asio::strand<boost::asio::any_io_executor> strand_;
  RequestIndex index_;  // strand only
};

}  // namespace ferry::http

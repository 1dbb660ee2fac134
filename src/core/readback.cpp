// readback.cpp — PendingRead (ferry/readback.h): a non-blocking copy to the host and an event after it.
#include "ferry/readback.h"

#include <utility>

#include "internal.h"

namespace ferry {

PendingRead::PendingRead(const Tensor& value, std::string label) : device_(value.device()), label_(std::move(label)) {
  if (device_.is_cpu()) {  // already on the host: nothing to wait for
    host_ = value;
    return;
  }
  // Non-blocking into pinned host memory, so the copy is truly asynchronous; later compute work on the device
  // waits for it (transfer() orders that), so nothing overwrites the value before it is read. sim finishes the
  // copy as it is called (its event is null) but the ledger records it as a card would: a non-blocking copy now,
  // the sync in wait().
  host_ = detail::transfer(value, kCPU, true, label_.c_str());
  Backend& be = backend(device_);
  event_ = be.create_event(device_.index);
  be.record_event(event_, be.copy_stream(device_.index));
  sync_at_wait_ = true;
}

PendingRead::~PendingRead() { release(); }

PendingRead::PendingRead(PendingRead&& other) noexcept
    : host_(std::exchange(other.host_, Tensor())), device_(other.device_),
      event_(std::exchange(other.event_, nullptr)), label_(std::move(other.label_)),
      sync_at_wait_(std::exchange(other.sync_at_wait_, false)) {}

PendingRead& PendingRead::operator=(PendingRead&& other) noexcept {
  if (this != &other) {
    release();
    host_ = std::exchange(other.host_, Tensor());
    device_ = other.device_;
    event_ = std::exchange(other.event_, nullptr);
    label_ = std::move(other.label_);
    sync_at_wait_ = std::exchange(other.sync_at_wait_, false);
  }
  return *this;
}

void PendingRead::release() noexcept {
  if (event_) backend(device_).destroy_event(event_, device_.index);
  event_ = nullptr;
  sync_at_wait_ = false;
  host_ = Tensor();
}

Tensor PendingRead::wait() {
  FERRY_CHECK(pending(), InvalidArgument, "PendingRead::wait(): nothing is pending (never started, or read already)");
  Tensor out = host_;
  if (sync_at_wait_) {
    detail::recorded_sync(device_, label_, [&] {
      if (event_) backend(device_).event_synchronize(event_, device_.index);
    });
  }
  release();
  return out;
}

}  // namespace ferry

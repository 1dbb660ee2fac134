// device_number.cpp — a host number kept in a float64 scalar on a device (ferry/optim.h, DeviceNumber):
// the learning rate that a captured SGD or Adam step reads as it runs.
#include "../core/internal.h"
#include "ferry/factories.h"
#include "ferry/optim.h"

namespace ferry::optim {

const double* DeviceNumber::get(Device device, double value, const char* what) {
  if (tensor_.defined() && tensor_.device() == device && written_ == value) {
    return static_cast<const double*>(tensor_.data_ptr());
  }
  ferry::detail::check_not_capturing(what);  // before anything changes
  if (!tensor_.defined() || tensor_.device() != device) {
    tensor_ = full({}, value, {.device = device, .dtype = DType::Float64});
  } else {
    tensor_.fill_(value);
  }
  written_ = value;
  return static_cast<const double*>(tensor_.data_ptr());
}

}  // namespace ferry::optim

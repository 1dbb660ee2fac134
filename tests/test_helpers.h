// test_helpers.h — shared test utilities: the devices to run on, tensor comparison, and a file's contents.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/ferry.h"

namespace ferry::testing {

// A file's whole contents, byte for byte ("" when it cannot be opened).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every device of this machine except cpu (the reference): sim:0 always, cuda:0 when present.
inline std::vector<Device> accelerators() {
  std::vector<Device> out;
  for (const Device& d : available_devices()) {
    if (!d.is_cpu() && d.index == 0) out.push_back(d);
  }
  return out;
}

inline std::vector<double> values(const Tensor& t) { return t.to(DType::Float64).to_vector<double>(); }

// Elementwise |a - b| <= atol + rtol * |b|, NaNs equal.
inline ::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-6) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << "shapes differ: " << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  if (a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << "dtypes differ: " << dtype_name(a.dtype()) << " vs " << dtype_name(b.dtype());
  const auto va = values(a), vb = values(b);
  for (std::size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) && std::isnan(vb[i])) continue;
    if (std::isinf(va[i]) && va[i] == vb[i]) continue;
    if (!(std::abs(va[i] - vb[i]) <= atol + rtol * std::abs(vb[i])))
      return ::testing::AssertionFailure() << "element " << i << ": " << va[i] << " vs " << vb[i];
  }
  return ::testing::AssertionSuccess();
}

// Each element of `got` that differs from `want`, a line each ("" when none): NaN matches NaN, an infinity itself,
// anything else within atol + rtol |want|. labels[i], where given, says what element i came from.
inline std::string differences(const Tensor& got, const Tensor& want, double rtol, double atol,
                               const std::vector<std::string>& labels = {}) {
  if (got.shape() != want.shape()) return "shape " + shape_str(got.shape()) + ", PyTorch " + shape_str(want.shape());
  const std::vector<double> a = values(got.cpu()), b = values(want);
  std::ostringstream text;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const bool same = (std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i] ||
                      std::abs(a[i] - b[i]) <= atol + rtol * std::abs(b[i]);
    if (same) continue;
    text << "\n  [" << i << "]";
    if (i < labels.size()) text << " " << labels[i];
    text << ": " << a[i] << ", PyTorch " << b[i];
  }
  return text.str();
}

}  // namespace ferry::testing
